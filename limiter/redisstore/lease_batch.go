package redisstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// The leases of several keys in one script call (limiter.LeaseBatcher). A
// near cache in front of the store commits its lease requests in groups:
// while one of its calls is under way on a lane, the requests that come
// wait, and the next call carries them all (nearcache/lanes.go). The store
// runs such a group as operations of the batch script, each a whole
// algorithm script on its own key with its own reply, so Redis runs one
// script where it ran one per key, and every operation decides exactly as
// its lone script would.
//
// A lane is a server the batch script can run on with all its keys: the
// one server of a standalone or Sentinel client, or each shard of a Ring.
// On a Cluster every client key has a hash slot of its own (its hash tag
// is the key's digest) and a script may touch keys of one slot only, so
// leases there share no call: LeaseLane says so, and the near cache sends
// each alone, as before.

// LeaseLane implements limiter.LeaseBatcher: 0 for a standalone or
// Sentinel client, the key's shard (numbered) on shards, -1 on a
// Cluster.
func (r *Store) LeaseLane(key string) int {
	switch {
	case r.reloadHashSlots != nil:
		return -1
	case r.shardOf == nil:
		return 0
	}
	if lane, ok := r.lanes[r.shardOf(r.Key(key))]; ok {
		return lane
	}
	return 0
}

// LeaseMany implements limiter.LeaseBatcher. Each shard's asks go to it in
// one call of the batch script (in calls of up to redisMaxReturns
// operations: a renewal is two), all shards at once, under the store's
// timeout; on a Cluster each ask goes alone, all at once. An ask's answer
// is its lease's operation's reply: the return a renewal carries may fail
// alone, which strands its units at worst (see limiter.Leaser.Renew).
func (r *Store) LeaseMany(ctx context.Context, asks []limiter.LeaseAsk) []limiter.LeaseAnswer {
	answers := make([]limiter.LeaseAnswer, len(asks))
	if r.reloadHashSlots != nil {
		var wg sync.WaitGroup
		for i, a := range asks {
			wg.Go(func() {
				if a.Back.Units > 0 {
					answers[i].Admission, answers[i].Err = r.Renew(ctx, a.Back, a.Cost, a.Want)
				} else {
					answers[i].Admission, answers[i].Err = r.TakeUpTo(ctx, a.Key, a.Cost, a.Want)
				}
			})
		}
		wg.Wait()
		return answers
	}
	ctx = r.deadlines.bound(ctx, r.timeout)
	var ops []leaseOp
	for i, a := range asks {
		if err := r.checkAsk(a); err != nil {
			answers[i].Err = err
			continue
		}
		op := leaseOp{ask: i}
		if a.Back.Units > 0 {
			op.calls = r.renewCalls(ctx, a.Back, a.Cost, a.Want)
		} else {
			op.calls = []*scriptCall{r.callOn(ctx, r.Key(a.Key), a.Cost, 0, a.Want)}
		}
		ops = append(ops, op)
	}
	eachGroup(byShard(r, ops, func(op leaseOp) string { return op.calls[0].key }), func(ops []leaseOp) {
		for len(ops) > 0 {
			n, width := 0, 0
			for n < len(ops) && (n == 0 || width+len(ops[n].calls) <= redisMaxReturns) {
				width += len(ops[n].calls)
				n++
			}
			r.runLeases(ctx, asks, ops[:n], answers)
			ops = ops[n:]
		}
	})
	return answers
}

// leaseOp is one ask of LeaseMany (asks[ask]) as operations of the batch
// script: its lease, after the return it carries, if any.
type leaseOp struct {
	ask   int
	calls []*scriptCall
}

// runLeases sends ops in one call of the batch script and sets their
// answers; the keys are all on one server.
func (r *Store) runLeases(ctx context.Context, asks []limiter.LeaseAsk, ops []leaseOp, answers []limiter.LeaseAnswer) {
	var calls []*scriptCall
	for _, op := range ops {
		calls = append(calls, op.calls...)
	}
	err := r.runBatch(ctx, calls)
	for _, op := range ops {
		ans, key := &answers[op.ask], asks[op.ask].Key
		lease := op.calls[len(op.calls)-1]
		if err == nil {
			err := lease.err
			if err == nil {
				ans.Admission, err = r.decodeReply(lease.reply)
			}
			if err == nil {
				ans.Admission = holding(ans.Admission, r, key, ans.Receipt.Granted)
				continue
			}
			ans.Err = fmt.Errorf("redis store for zone %q: lease: %w", r.zone, err)
			continue
		}
		ans.Err = fmt.Errorf("redis store for zone %q: lease in a batch of %d: %w", r.zone, len(ops), err)
	}
}

// checkAsk refuses an ask the policy cannot grant, or whose return is not
// of its key.
func (r *Store) checkAsk(a limiter.LeaseAsk) error {
	if err := r.checkLease(a.Cost, a.Want); err != nil {
		return err
	}
	if a.Back.Units > 0 {
		if a.Back.Key != a.Key {
			return fmt.Errorf("redis store for zone %q: a lease of one key renewed with the return of another", r.zone)
		}
		return r.checkCost(a.Back.Units)
	}
	return nil
}

var _ limiter.LeaseBatcher = (*Store)(nil)

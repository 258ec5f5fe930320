package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/redis/go-redis/v9"
)

// A nearcache.Cache gives units back to Redis in bulk: leases lapse by the
// thousand on a busy instance, and one script call per lease would cost
// Redis as much as the decisions the leases saved. The batch script
// (lua.Batch) runs any number of one algorithm's operations in one atomic
// EVALSHA, in order, and replies with every one's reply (or error).
// ReturnMany sends up to redisMaxReturns returns per call; Renew sends a
// lapsed lease's give-back and the next lease's take for one key together;
// LeaseMany (lease_batch.go) the leases of several keys.
//
// On a Cluster every client key is in a hash slot of its own (its hash tag
// is the key's digest), and a script may only touch keys of one slot, so
// ReturnMany sends there one script per give-back, pipelined as concurrent
// decisions are. On shards a script runs on the shard of its first key, so
// ReturnMany sends each shard's returns in calls of their own (byShard).
// Renew names one key and works everywhere.

// redisReturnTimeout bounds one call of ReturnMany's. Give-backs run off
// the request path, so they may wait far longer than a decision does; one
// that fails leaves its units taken until the key's state expires.
const redisReturnTimeout = time.Second

// redisMaxReturns bounds the returns of one script call, so that it
// holds Redis, which runs one script at a time, about as long as a
// pipeline of decisions does (see redisMaxPipeline).
const redisMaxReturns = redisMaxPipeline

// Renew implements Leaser with one call of the batch script: the return,
// then the lease.
func (r *Store) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	if err := r.checkLease(cost, want); err != nil {
		return limiter.Admission{}, err
	}
	if err := r.checkCost(back.Units); err != nil {
		return limiter.Admission{}, err
	}
	ctx = r.deadlines.bound(ctx, r.timeout)
	calls := r.renewCalls(ctx, back, cost, want)
	err := r.runBatch(ctx, calls)
	if err == nil {
		// The lease's answer; the return's is not read, as a failed return
		// strands its units at worst (see limiter.Leaser.Renew).
		err = calls[1].err
	}
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("redis store for zone %q: renewing a lease: %w", r.zone, err)
	}
	a, err := r.decodeReply(calls[1].reply)
	if err != nil {
		return limiter.Admission{}, err
	}
	a = holding(a, r, back.Key, a.Receipt.Granted)
	return a, nil
}

// renewCalls are the two operations of a renewal, for the batch script:
// back's return, then the lease, on one key.
func (r *Store) renewCalls(ctx context.Context, back limiter.Return, cost, want int64) []*scriptCall {
	key := r.Key(back.Key)
	return []*scriptCall{
		r.callOn(ctx, key, -back.Units, back.Taken.Epoch, r.refundArg(back.Taken)),
		r.callOn(ctx, key, cost, 0, want),
	}
}

// ReturnMany implements Leaser: up to redisMaxReturns returns per script
// call, or on a Cluster one per refund, each call bounded by
// redisReturnTimeout.
func (r *Store) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	for _, rf := range returns {
		if err := r.checkCost(rf.Units); err != nil {
			return err
		}
	}
	var failed int
	var errs []error
	fail := func(n int, err error) {
		failed += n
		if len(errs) < 3 { // enough to say why, not one per key
			errs = append(errs, err)
		}
	}
	if r.reloadHashSlots != nil {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, rf := range returns {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, redisReturnTimeout)
				defer cancel()
				if _, err := r.runCall(r.newCall(cctx, rf.Key, -rf.Units, rf.Taken.Epoch, r.refundArg(rf.Taken))); err != nil {
					mu.Lock()
					fail(1, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	} else {
		// On shards, each shard's returns go to it in calls of their
		// own, all shards at once.
		var mu sync.Mutex
		groups := byShard(r, returns, func(rf limiter.Return) string { return r.Key(rf.Key) })
		eachGroup(groups, func(returns []limiter.Return) {
			calls := make([]*scriptCall, 0, min(len(returns), redisMaxReturns))
			for start := 0; start < len(returns); start += redisMaxReturns {
				calls = calls[:0]
				cctx, cancel := context.WithTimeout(ctx, redisReturnTimeout)
				for _, rf := range returns[start:min(len(returns), start+redisMaxReturns)] {
					calls = append(calls, r.newCall(cctx, rf.Key, -rf.Units, rf.Taken.Epoch, r.refundArg(rf.Taken)))
				}
				err := r.runBatch(cctx, calls)
				cancel()
				mu.Lock()
				if err != nil {
					fail(len(calls), err)
				}
				for _, c := range calls {
					if err == nil && c.err != nil {
						fail(1, c.err)
					}
				}
				mu.Unlock()
			}
		})
	}
	if failed > 0 {
		return fmt.Errorf("redis store for zone %q: %d of %d returns failed: %w", r.zone, failed, len(returns), errors.Join(errs...))
	}
	return nil
}

// runBatch runs calls, each a decision as newCall builds it, in one call
// of the batch script, and sets each one's reply or error: an operation
// that refuses its key's state (a value Floodgate does not write) fails
// alone. The error it returns is the whole call's, which may or may not
// have run any of them. The keys must all be on one server: on shards,
// the first key's shard runs the script (see byShard).
func (r *Store) runBatch(ctx context.Context, calls []*scriptCall) error {
	b := r.breakerFor(calls[0].key)
	if b.open() {
		return ErrUnavailable
	}
	keys := make([]string, len(calls))
	for i, c := range calls {
		keys[i] = c.key
	}
	run := func() error {
		var args []any
		for _, c := range calls {
			args = append(args, len(c.args))
			args = append(args, c.args...)
		}
		replies, err := r.batchScript.Run(ctx, r.client, keys, args...).Slice()
		if err != nil {
			return err
		}
		if len(replies) != len(calls) {
			return fmt.Errorf("batch script replied %d values for %d operations", len(replies), len(calls))
		}
		for i, c := range calls {
			c.reply, c.err = batchReply(replies[i])
		}
		return nil
	}
	err := run()
	if err != nil && r.onInstanceClock(ctx, err, calls...) {
		err = run()
	}
	return r.outcome(b, err)
}

// batchReply reads one operation's part of the batch script's reply: its
// array of integers, or its error.
func batchReply(v any) ([]int64, error) {
	switch v := v.(type) {
	case redis.Error:
		return nil, v
	case []any:
		reply := make([]int64, len(v))
		for i, x := range v {
			n, ok := x.(int64)
			if !ok {
				return nil, fmt.Errorf("batch script replied %T in an operation's reply, want integers", x)
			}
			reply[i] = n
		}
		return reply, nil
	}
	return nil, fmt.Errorf("batch script replied %T for an operation, want an array or an error", v)
}

package nearcache

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Group commit of lease requests. Under load most of a cache's calls to
// the store are lease requests of different keys, each a script call of
// its own in Redis. When the store can take several keys' leases in one
// call (limiter.LeaseBatcher), the cache commits them in groups, per lane
// (a server the store can run one call on with all its keys, such as one
// shard):
//
//   - A request that finds no call of its lane under way goes at once, by
//     itself (TakeUpTo, Renew): a lone request waits for nothing more than
//     before.
//   - One that finds a call under way joins the lane's queue. When the
//     call returns, everything queued goes in one LeaseMany (in several
//     at once, of up to leaseBatchOps operations of the store each, when
//     more queued), and so on while requests queue. A queued request
//     waits at most for the call under way and its own.
//   - Each ask gets its own answer, delivered to its own refill; a failed
//     call fails each of its asks as a failed call does alone (the zone's
//     fail mode applies to the request). Refills ahead and renewals (a
//     give-back that rides with the next lease) queue like any request.
//   - A request whose context ends while it is queued leaves; its refill
//     stays under way for its key, and what it brings becomes the key's
//     lease, whole, as for a refill ahead: spent by the key's next
//     requests or given back when it lapses (at once if they may not
//     spend it: a sliding log's grant not logged ahead), never taken and
//     left unclaimed (nearAsk.left).
//
// Why here and not in the Redis store: the store answers for each call
// alone and would have to give back a grant whose caller had gone, a call
// of its own; the cache knows what an answer means for its key whoever
// asked (a lease, a refusal to cache, nothing after a reset), and orders
// refills against resets, closes and expiries (nearShard.backs, forgotten,
// returns) in one place, which the model test drives, coalesced calls
// included. The store says only which keys may share a call (LeaseLane)
// and runs a group as one script (docs/design.md, "The near cache").

// leaseBatchOps bounds the store operations of one group call (a renewal
// is two: its give-back and its lease), so one call holds Redis, which
// runs one script at a time, about as long as a pipeline of 64 decisions.
const leaseBatchOps = 64

// cacheLanes is how many lanes a cache keeps; a store's lanes share them
// modulo this many, which costs two lanes whose numbers meet only their
// independence, never a call mixing servers (the store splits by server).
const cacheLanes = 16

// nearLane is one lane's group commit: whether a call is under way, and
// the asks waiting for it to return.
type nearLane struct {
	mu    sync.Mutex
	busy  bool
	queue []*nearAsk
}

// The states of a queued ask: waiting for its answer, answered, or left
// by its requester (whose context ended) before the answer came.
const (
	askWaiting int32 = iota
	askAnswered
	askLeft
)

// nearAsk is one lease request on its way to the store.
type nearAsk struct {
	limiter.LeaseAsk
	// ctx is the requester's context without its cancellation, for a call
	// it sends alone; bound, when set, bounds the call (aheadTimeout).
	ctx   context.Context
	bound time.Duration
	// d and err are the answer; done is closed once they are set, for an
	// ask that waited in a queue.
	d     limiter.Admission
	err   error
	done  chan struct{}
	state atomic.Int32
	// left, when the requester leaves, does with the answer what the
	// requester would have, on the goroutine that delivers it. unhold,
	// if set, first releases what the ask holds until it is answered (a
	// renewal's give-back lock); settle runs it for every left ask before
	// any left, which may wait for such a lock.
	left, unhold func()
}

// ops is how many operations of the store the ask is.
func (a *nearAsk) ops() int {
	if a.Back.Units > 0 {
		return 2
	}
	return 1
}

// laneOf is the lane key's leases go by, or nil when they go alone: the
// store takes no leases in groups, or none of key's (a Cluster).
func (c *Cache) laneOf(key string) *nearLane {
	if c.batcher == nil {
		return nil
	}
	lane := c.batcher.LeaseLane(key)
	if lane < 0 {
		return nil
	}
	return &c.lanes[lane%cacheLanes]
}

// ask sends a to the store, alone or in a group (see above), and reports
// once a's answer is set (a.d, a.err): true, or false when ctx ended
// while a was queued and the requester left (a.left then takes the
// answer). ctx is the requester's; a background context never leaves.
func (c *Cache) ask(ctx context.Context, a *nearAsk) bool {
	l := c.laneOf(a.Key)
	if l == nil {
		c.callAlone(a)
		return true
	}
	l.mu.Lock()
	if !l.busy {
		l.busy = true
		l.mu.Unlock()
		c.callAlone(a)
		c.nextGroup(l)
		return true
	}
	a.done = make(chan struct{})
	l.queue = append(l.queue, a)
	l.mu.Unlock()
	if c.queued != nil {
		c.queued(a.Key)
	}
	select {
	case <-a.done:
		return true
	case <-ctx.Done():
		if a.state.CompareAndSwap(askWaiting, askLeft) {
			return false
		}
		<-a.done // answered meanwhile: it is here
		return true
	}
}

// callAlone sends a by itself and sets its answer.
func (c *Cache) callAlone(a *nearAsk) {
	ctx := a.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	cancel := context.CancelFunc(func() {})
	if a.bound > 0 {
		ctx, cancel = context.WithTimeout(ctx, a.bound)
	}
	if a.Back.Units > 0 {
		a.d, a.err = c.store.Renew(ctx, a.Back, a.Cost, a.Want)
	} else {
		a.d, a.err = c.store.TakeUpTo(ctx, a.Key, a.Cost, a.Want)
	}
	cancel()
}

// nextGroup ends a call of lane l: if asks queued meanwhile, a goroutine
// sends them all (in calls of up to leaseBatchOps operations, at once),
// and the lane's next call waits for every one of them to return, so the
// caller whose call returned does not wait for others'.
func (c *Cache) nextGroup(l *nearLane) {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.busy = false
		l.mu.Unlock()
		return
	}
	groups := l.takeAll()
	l.mu.Unlock()
	run := func() {
		var wg sync.WaitGroup
		for _, group := range groups[1:] {
			wg.Go(func() { c.callGroup(group) })
		}
		c.callGroup(groups[0])
		wg.Wait()
		c.nextGroup(l)
		c.settle(groups)
	}
	if c.goGroup != nil {
		var keys []string
		for _, group := range groups {
			for _, a := range group {
				keys = append(keys, a.Key)
			}
		}
		c.goGroup(keys, run)
		return
	}
	go run()
}

// takeAll empties l's queue into groups of up to leaseBatchOps operations
// of the store (at least one ask each), oldest first among asks of one
// bound; l.mu is held. Only asks of one bound share a group: its call is
// bounded by that bound, and a token bucket's refill ahead (aheadTimeout)
// would otherwise cut short a request's refill, which the store's own
// timeout bounds (TestNearCacheGroupsKeepAsksOfOneBound).
func (l *nearLane) takeAll() [][]*nearAsk {
	queue := slices.Clone(l.queue)
	clear(l.queue)
	l.queue = l.queue[:0]
	slices.SortStableFunc(queue, func(x, y *nearAsk) int { return cmp.Compare(x.bound, y.bound) })
	var groups [][]*nearAsk
	for start := 0; start < len(queue); {
		n, ops := 0, 0
		for start+n < len(queue) && (n == 0 || queue[start+n].bound == queue[start].bound && ops+queue[start+n].ops() <= leaseBatchOps) {
			ops += queue[start+n].ops()
			n++
		}
		groups = append(groups, queue[start:start+n])
		start += n
	}
	return groups
}

// callGroup sends group in one call of the store (a group of one by
// itself, as a lone ask goes), bounded by its asks' bound (takeAll groups
// asks of one bound only),
// and sets each ask's answer.
func (c *Cache) callGroup(group []*nearAsk) {
	if len(group) == 1 {
		c.callAlone(group[0])
		return
	}
	asks := make([]limiter.LeaseAsk, len(group))
	for i, a := range group {
		asks[i] = a.LeaseAsk
	}
	bound := group[0].bound
	// Nobody's context: each requester waits on its own, and the store
	// bounds the call with its timeout.
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if bound > 0 {
		ctx, cancel = context.WithTimeout(ctx, bound)
	}
	answers := c.batcher.LeaseMany(ctx, asks)
	cancel()
	for i, a := range group {
		a.d, a.err = answers[i].Admission, answers[i].Err
	}
}

// settle hands each ask of groups its answer: to its requester, or, if
// the requester left, to a.left, run here once every requester has been
// answered and every left ask unheld. It runs after the lane has moved
// on, so what a.left starts (a refill ahead) may queue behind the next
// group without waiting for itself. a.left may wait for a shard's
// give-back lock (a closed cache gives its lease straight back) behind an
// admin reset that waits in turn for a renewal of these groups to be
// answered, its requester's or a left one's: answering every requester
// and releasing every left renewal's lock first is what keeps that from
// deadlocking (TestNearCacheGroupAnsweredBeforeLeftDuringReset,
// TestNearCacheLeftRenewalReleasedBeforeLeftGiveBack).
func (c *Cache) settle(groups [][]*nearAsk) {
	var left []*nearAsk
	for _, group := range groups {
		for _, a := range group {
			if !a.state.CompareAndSwap(askWaiting, askAnswered) {
				left = append(left, a)
			}
			close(a.done)
		}
	}
	for _, a := range left {
		if a.unhold != nil {
			a.unhold()
		}
	}
	for _, a := range left {
		a.left()
	}
}

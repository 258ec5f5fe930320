package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A Redis concurrency slot is scored by when it lapses, now + W, so that
// the slots of an instance that dies are freed after W. A request that
// runs longer than W must not lose its slot while it runs: the store
// remembers the slots it holds and renews them all, every W/3, until
// their requests finish. Renewal costs Redis a call per instance per
// period, for up to redisMaxRenewals slots on 64 keys each, not one per request
// (on a Cluster, where every key has a hash slot of its own, one script
// per key, pipelined; on shards, calls of each shard's own). A slot whose
// instance stopped renewing (it died, or Redis was unreachable for W)
// lapses as before.

// redisMaxRenewals bounds the slots one renewal call names, and
// redisMaxReturns its keys, so that a call holds Redis, which runs one
// script at a time, about as long as a pipeline of decisions does (10,000
// slots on as many keys in calls of 1000 held Redis 12ms a call, past the
// default decision timeout).
const redisMaxRenewals = 1000

// minRenewEvery is the shortest renewal period, for a tiny window.
const minRenewEvery = time.Millisecond

// heldSlot is a concurrency slot this store took and has not released:
// its units on the Redis key redisKey (the table holds it by its id).
type heldSlot struct {
	redisKey string
	units    int64
}

// slotTable is the slots a Redis concurrency store holds, and its
// renewer's stop channel while one runs. The renewer starts with the
// first slot and stops with the release of the last, so a store holds no
// goroutine while idle, and a handler after its Cleanup still renews what
// its requests in flight hold.
type slotTable struct {
	mu   sync.Mutex
	held map[string]heldSlot // by slot id
	// stop, while the renewer runs, is closed to stop it.
	stop chan struct{}
}

// hold remembers the slot named id, and starts the renewer if it is not
// running.
func (r *Store) hold(id, redisKey string, units int64) {
	s := &r.slots
	s.mu.Lock()
	if s.held == nil {
		s.held = make(map[string]heldSlot)
	}
	s.held[id] = heldSlot{redisKey: redisKey, units: units}
	var stop chan struct{}
	if s.stop == nil {
		stop = make(chan struct{})
		s.stop = stop
	}
	s.mu.Unlock()
	if stop != nil {
		go r.renewLoop(stop)
	}
}

// release forgets the slot named id, before its release is sent: a
// release that fails leaves the slot to lapse, never renewed again. The
// last slot's release stops the renewer.
func (r *Store) release(id string) {
	s := &r.slots
	s.mu.Lock()
	delete(s.held, id)
	if len(s.held) == 0 && s.stop != nil {
		close(s.stop)
		s.stop = nil
	}
	s.mu.Unlock()
}

// renewEvery is how often held slots are renewed: three times per lapse
// period, so two renewals in a row may fail before a slot lapses.
func (r *Store) renewEvery() time.Duration {
	return max(microseconds(r.p.W)/3, minRenewEvery)
}

// renewLoop renews the held slots every renewEvery until stop closes.
func (r *Store) renewLoop(stop <-chan struct{}) {
	tick := time.NewTicker(r.renewEvery())
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if err := r.renewSlots(context.Background()); err != nil && r.onRenewError != nil {
			r.onRenewError(err)
		}
	}
}

// renewSlots pushes the lapse of every slot this store holds to now + W,
// in as few calls as the client allows, each bounded by
// redisReturnTimeout. A slot that already lapsed or was released is not
// added back.
func (r *Store) renewSlots(ctx context.Context) error {
	byKey := make(map[string][]any)
	r.slots.mu.Lock()
	for id, s := range r.slots.held {
		byKey[s.redisKey] = append(byKey[s.redisKey], id, s.units)
	}
	r.slots.mu.Unlock()
	if len(byKey) == 0 {
		return nil
	}
	var (
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		if len(errs) < 3 { // enough to say why, not one per key
			errs = append(errs, err)
		}
		mu.Unlock()
	}
	if r.reloadHashSlots != nil {
		// A Cluster: one script per key, pipelined as concurrent decisions
		// are.
		var wg sync.WaitGroup
		for key, slots := range byKey {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, redisReturnTimeout)
				defer cancel()
				if _, err := r.runCall(r.renewCall(cctx, key, slots)); err != nil {
					fail(err)
				}
			})
		}
		wg.Wait()
	} else {
		// On shards, each shard's keys go to it in calls of their own,
		// all shards at once.
		keys := make([]string, 0, len(byKey))
		for key := range byKey {
			keys = append(keys, key)
		}
		eachGroup(byShard(r, keys, func(k string) string { return k }), func(keys []string) {
			var calls []*scriptCall
			named := 0
			flush := func() {
				cctx, cancel := context.WithTimeout(ctx, redisReturnTimeout)
				defer cancel()
				if err := r.runBatch(cctx, calls); err != nil {
					fail(err)
				}
				for _, c := range calls {
					if c.err != nil {
						fail(c.err)
					}
				}
				calls, named = calls[:0], 0
			}
			for _, key := range keys {
				slots := byKey[key]
				for len(slots) > 0 {
					n := min(len(slots), 2*(redisMaxRenewals-named))
					calls = append(calls, r.renewCall(ctx, key, slots[:n]))
					named += n / 2
					slots = slots[n:]
					if named == redisMaxRenewals || len(calls) == redisMaxReturns {
						flush()
					}
				}
			}
			if len(calls) > 0 {
				flush()
			}
		})
	}
	if len(errs) > 0 {
		return fmt.Errorf("redis store for zone %q: renewing concurrency slots: %w", r.zone, errors.Join(errs...))
	}
	return nil
}

// renewCall is the script call that renews slots (id, units, id, units,
// ...) on redisKey: concurrency.lua's "renew" operation.
func (r *Store) renewCall(ctx context.Context, redisKey string, slots []any) *scriptCall {
	c := r.callOn(ctx, redisKey, 0, 0, "")
	c.args = append(c.args, "renew")
	c.args = append(c.args, slots...)
	return c
}

// HeldSlots is how many concurrency slots the store holds for requests
// still in flight, which it renews until they finish.
func (r *Store) HeldSlots() int {
	r.slots.mu.Lock()
	defer r.slots.mu.Unlock()
	return len(r.slots.held)
}

// RenewSlots renews at once the slots this store holds, as its renewer
// does every third of the window: for tests that step time themselves
// (the model test in limiter/nearcache), not for production callers.
func (r *Store) RenewSlots(ctx context.Context) error { return r.renewSlots(ctx) }

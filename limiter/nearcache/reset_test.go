package nearcache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// heldReply is a shared store that, once armed, holds the answer of its
// next decision (Take, TakeUpTo or Renew) after the store has made it,
// until the test lets it go: a reply still on its way while the test does
// something else, deterministically.
type heldReply struct {
	replyHook
	replyGate
}

// replyGate holds one call, once armed, until the test lets it go.
type replyGate struct {
	mu      sync.Mutex
	armed   bool
	decided chan struct{} // closed once the armed call has come
	release chan struct{} // closed to let it through
}

// arm holds the next call.
func (h *replyGate) arm() {
	h.mu.Lock()
	h.armed = true
	h.decided, h.release = make(chan struct{}), make(chan struct{})
	h.mu.Unlock()
}

// waitCalled waits for the armed call to come, failing with why after
// 5 s.
func (h *replyGate) waitCalled(t *testing.T, why string) {
	t.Helper()
	select {
	case <-h.decided:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// resetAsync resets key on cache in a goroutine; the channel gets its
// error.
func resetAsync(ctx context.Context, cache *Cache, key string) chan error {
	done := make(chan error, 1)
	go func() {
		_, err := cache.Reset(ctx, key)
		done <- err
	}()
	return done
}

func (h *replyGate) hold() {
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	decided, release := h.decided, h.release
	h.mu.Unlock()
	if armed {
		close(decided)
		<-release
	}
}

// newHeldReply is a heldReply in front of l.
func newHeldReply(l limiter.Leaser) *heldReply {
	h := &heldReply{}
	h.replyHook = replyHook{Leaser: l, answered: func(bool) { h.hold() }}
	return h
}

// replyHook is a shared store that calls answered once the store has
// decided a Take, TakeUpTo or Renew (renew: it was a Renew), before its
// answer goes back.
type replyHook struct {
	limiter.Leaser
	answered func(renew bool)
}

func (h replyHook) Take(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	d, err := h.Leaser.Take(ctx, key, cost)
	h.answered(false)
	return d, err
}

func (h replyHook) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	d, err := h.Leaser.TakeUpTo(ctx, key, cost, want)
	h.answered(false)
	return d, err
}

func (h replyHook) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	d, err := h.Leaser.Renew(ctx, back, cost, want)
	h.answered(true)
	return d, err
}

// resetDuringReply takes one unit of key through cache, whose store is h,
// and resets key on cache once the store decided that take, before its
// answer reaches the cache. It returns the take's decision. A reset waits
// for a renewal's answer (the units it gives back are ordered against
// resets: nearShard.backs), so it is let through after 200 ms if the
// reset has not returned by then.
func resetDuringReply(t *testing.T, cache *Cache, h *heldReply, key string) limiter.Decision {
	t.Helper()
	ctx := context.Background()
	h.arm()
	done := takeAsync(ctx, cache, key, 1)
	h.waitCalled(t, "the take never reached the store")
	resetDone := resetAsync(ctx, cache, key)
	select {
	case err := <-resetDone:
		resetDone <- err
	case <-time.After(200 * time.Millisecond):
	}
	close(h.release)
	if err := <-resetDone; err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.d.Decision
}

// admitAll takes key one unit at a time through cache until it is refused
// (at most 3 × limit times) and returns how many were admitted.
func admitAll(t *testing.T, cache *Cache, key string, limit int64) int64 {
	t.Helper()
	return storetest.AdmitAll(t, cache, key, 3*limit)
}

// TestNearCacheResetDropsLeaseInFlight: an admin reset forgets every lease
// granted before it, one whose answer is still on its way included. A
// fixed window of 10, leases up to the whole quota: the key's third lease
// (4 units, or a renewal of 2 after the last lapsed with a unit unspent)
// is decided by the store, then the key is reset on the same instance,
// then the answer arrives (a renewal's answer the reset waits for, since
// the renewal gives units back: it is installed, then forgotten). Its
// request is admitted (it was decided before the reset), but its lease is
// never spent: after the reset the instance alone admits the fresh 10 and
// no more. (Before the fix the answer
// installed the old grant after the reset: 13 admitted, or 11 on the
// renewal, the bound docs/near-cache.md gives one instance being 10.) Its units are
// not given back either: the reset erased them in the store.
func TestNearCacheResetDropsLeaseInFlight(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		for _, path := range []string{"lease", "renewal"} {
			t.Run(name+"/"+path, func(t *testing.T) {
				clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
				h := newHeldReply(backend(t, p, clock))
				cache := edgeCaches(t, h, p, clock, 1, 1)[0]
				// Leases of 1 and 2, each used up at once: the next is 4.
				// For a renewal, the second lapses with a unit unspent,
				// which the next lease's call gives back.
				for range 2 {
					storetest.MustAdmit(t, cache, "k")
				}
				if path == "lease" {
					storetest.MustAdmit(t, cache, "k")
				} else {
					clock.Advance(limiter.LeaseLifetime)
				}
				if d := resetDuringReply(t, cache, h, "k"); !d.Allowed {
					t.Fatalf("the take whose lease was in flight: %+v, want admitted", d)
				}
				if units, _, _ := cache.lease("k"); units != 0 {
					t.Errorf("after the reset the cache holds %d units of a lease granted before it", units)
				}
				if got := admitAll(t, cache, "k", p.Events); got != p.Events {
					t.Errorf("admitted %d after the reset, want the fresh window's %d", got, p.Events)
				}
				if err := cache.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				if d, err := h.Leaser.Peek(context.Background(), "k"); err != nil || d.Remaining != 0 {
					t.Errorf("the store after the fresh window was spent and every lease given back: %+v %v, want 0 remaining", d, err)
				}
			})
		}
	}
}

// TestNearCacheResetForgetsRefusalInFlight: a refusal the store made
// before an admin reset is not repeated from the denial cache after it,
// whether it answered a lease's refill or, without leases, a take. (Before
// the fix the refusal arriving after the reset was cached, and the key,
// reset to a full window, was refused for up to deny_cache.)
func TestNearCacheResetForgetsRefusalInFlight(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 3, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		for _, fraction := range []float64{0, 1} {
			label := name + "/no leases"
			if fraction > 0 {
				label = name + "/leases"
			}
			t.Run(label, func(t *testing.T) {
				clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
				h := newHeldReply(backend(t, p, clock))
				cache := openCache(t, h, p, Options{LeaseFraction: fraction, DenyFor: time.Second, Clock: clock, manualSweep: true})
				if got := admitAll(t, cache, "k", p.Events); got != p.Events {
					t.Fatalf("admitted %d, want %d", got, p.Events)
				}
				clock.Advance(time.Second) // past the cached refusal
				if d := resetDuringReply(t, cache, h, "k"); d.Allowed {
					t.Fatalf("the take the store refused before the reset: %+v, want refused", d)
				}
				d, err := cache.Take(context.Background(), "k", 1)
				if err != nil || !d.Allowed {
					t.Fatalf("the first take after the reset: %+v %v, want admitted", d, err)
				}
			})
		}
	}
}

// heldGiveBack is a shared store that, once armed, holds its next
// ReturnMany before the store sees it: a give-back on the wire.
type heldGiveBack struct {
	limiter.Leaser
	replyGate
}

func (h *heldGiveBack) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	h.hold()
	return h.Leaser.ReturnMany(ctx, returns)
}

// TestNearCacheResetOrdersGiveBacks: a reset and the janitor's give-back
// of a lapsed lease's units, sent before the reset and not yet at the
// store, are ordered: the reset waits for the give-back, so its units
// land in the state the reset forgets, never in the fresh one. A fixed
// window of 10: after the reset, this instance and a store-only one
// together admit 10. (Before the fix the reset ran at once, the other
// instance took 5 from the fresh window, then the unit given back made
// it 4: 11 admitted after the reset.)
func TestNearCacheResetOrdersGiveBacks(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	ctx := context.Background()
	onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
		h := &heldGiveBack{Leaser: shared}
		cache := edgeCaches(t, h, p, clock, 1, 1)[0]
		for range 2 { // leases of 1 and 2: a unit left
			storetest.MustAdmit(t, cache, "k")
		}
		clock.Advance(limiter.LeaseLifetime)
		h.arm()
		cache.sweep(false) // gives the lapsed lease's unit back
		h.waitCalled(t, "the sweep gave nothing back")
		resetDone := resetAsync(ctx, cache, "k")
		var after int64 // admitted once the reset has returned
		reset := false
		select {
		case err := <-resetDone:
			if err != nil {
				t.Fatal(err)
			}
			reset = true
		case <-time.After(200 * time.Millisecond): // waiting for the give-back
		}
		for range 5 { // another instance, without a near cache
			d, err := h.Leaser.Take(ctx, "k", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("the other instance: %+v %v", d, err)
			}
			if reset {
				after++
			}
		}
		close(h.release)
		if !reset {
			if err := <-resetDone; err != nil {
				t.Fatal(err)
			}
		}
		cache.givingBack.Wait()
		after += admitAll(t, cache, "k", p.Events)
		if after > p.Events {
			t.Errorf("admitted %d after the reset, limit %d", after, p.Events)
		}
	})
}

// TestResetForgetsOneKey: Reset starts one key afresh in both stores and in
// a near cache, and leaves every other key, and the same key of another
// zone, as they were.
func TestResetForgetsOneKey(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 3, Window: time.Hour}
	client := redistest.Start(t).Client(t)
	stores := map[string]func(zone string) limiter.Store{
		"memory": func(string) limiter.Store {
			return newTestMemory(t, p, nil)
		},
		"redis": func(zone string) limiter.Store {
			return newTestRedis(t, client, p, redisstore.Options{Zone: zone, Timeout: 5 * time.Second})
		},
		"near cache": func(zone string) limiter.Store {
			return openCache(t, newTestRedis(t, client, p, redisstore.Options{Zone: zone, Timeout: 5 * time.Second}), p, Options{LeaseFraction: 1, DenyFor: time.Second})
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			zone := "reset-" + name
			s, other := open(zone), open(zone+"-other")
			for _, st := range []limiter.Store{s, other} {
				for _, key := range []string{"a/b:c", "d"} {
					for range 4 {
						if _, err := st.Take(ctx, key, 1); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if existed, err := s.Reset(ctx, "a/b:c"); err != nil || !existed {
				t.Fatalf("reset of a key with state: existed %v, %v", existed, err)
			}
			if existed, err := s.Reset(ctx, "a/b:c"); err != nil || existed {
				t.Fatalf("second reset: existed %v, %v, want false", existed, err)
			}
			peek := func(st limiter.Store, key string) int64 {
				d, err := st.Peek(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			if got := peek(s, "a/b:c"); got != 3 {
				t.Errorf("reset key: %d remaining, want all 3", got)
			}
			if got := peek(s, "d"); got != 0 {
				t.Errorf("another key: %d remaining after the reset, want 0", got)
			}
			if got := peek(other, "a/b:c"); got != 0 {
				t.Errorf("the key in another zone: %d remaining after the reset, want 0", got)
			}
			if d, _ := s.Take(ctx, "a/b:c", 1); !d.Allowed || d.Remaining != 2 {
				t.Errorf("first request after the reset: %+v", d)
			}
		})
	}
}

// TestResetsStartedTogether: two caches of one process in front of one
// state reset a key as one admin reset (StartReset on both, then each
// store's reset, then End on both). Between the two store resets the
// first cache leases units from the state the second's erases (leases of
// 1, 2 and 4: 3 unspent); End forgets them, so after the reset the two
// admit the fresh 10 and no more. Reset one after the other (Reset on
// the first, its requests, Reset on the second), the first kept its 3
// units: 13.
func TestResetsStartedTogether(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	ctx := context.Background()
	onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
		caches := edgeCaches(t, shared, p, clock, 2, 0.5)
		a, b := caches[0], caches[1]
		for range 3 { // state and leases on both before the reset
			storetest.MustAdmit(t, a, "k")
			storetest.MustAdmit(t, b, "k")
		}
		ra, rb := a.StartReset("k"), b.StartReset("k")
		if existed, err := ra.ResetStore(ctx); err != nil || !existed {
			t.Fatalf("first store's reset: existed %v, %v", existed, err)
		}
		for range 4 {
			storetest.MustAdmit(t, a, "k")
		}
		if _, err := rb.ResetStore(ctx); err != nil {
			t.Fatal(err)
		}
		ra.End()
		rb.End()
		rb.End() // a second End does nothing
		if held := a.held() + b.held(); held != 0 {
			t.Errorf("the caches hold %d units after the reset, want none", held)
		}
		if admitted := admitAll(t, a, "k", p.Events) + admitAll(t, b, "k", p.Events); admitted != p.Events {
			t.Errorf("admitted %d after the reset, want the fresh %d", admitted, p.Events)
		}
	})
}

// TestResetGiveBackOfForgottenRefill: a take whose lease was decided on
// the state an admin reset then erased is admitted, and holds its cost of
// the store (refill, case forgotten). When another zone refuses the
// request, the admission gives that cost back, naming the erased state
// (Receipt.Epoch): the store drops it, since the fresh state never
// counted it, and the key admits its limit after the reset, not a unit
// more.
func TestResetGiveBackOfForgottenRefill(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
		h := newHeldReply(shared)
		cache := edgeCaches(t, h, p, clock, 1, 1)[0]
		for range 3 {
			storetest.MustAdmit(t, cache, "k")
		}
		ctx := context.Background()
		h.arm()
		done := takeAsync(ctx, cache, "k", 1)
		<-h.decided
		if _, err := cache.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		close(h.release)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		a := r.d
		if !a.Allowed {
			t.Fatalf("the take decided before the reset: %+v", a.Decision)
		}
		// Five of the fresh window's units are spent; then another
		// zone refuses the request: its units come back.
		for range 5 {
			storetest.MustAdmit(t, cache, "k")
		}
		if _, err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := 5 + admitAll(t, cache, "k", p.Events); got != p.Events {
			t.Errorf("admitted %d after the reset, want the fresh window's %d: the unit in flight at the reset never reached it", got, p.Events)
		}
	})
}

// TestResetGiveBackInFlight: the same without a near cache: an admission
// taken before an admin reset and given back after it (another zone
// refused the request, or its response reported less) names the state
// that took it (Receipt.Epoch), and the fresh state, which never counted
// it, is not credited.
func TestResetGiveBackInFlight(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
		s := shared
		ctx := context.Background()
		a := storetest.MustAdmit(t, s, "k")
		if _, err := s.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			storetest.MustAdmit(t, s, "k")
		}
		if _, err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		n := 5 + storetest.AdmitAll(t, s, "k", 20)
		if n != p.Events {
			t.Errorf("admitted %d in the fresh window, want %d: the unit in flight at the reset never reached it", n, p.Events)
		}
	})
}

// TestResetGiveBackThroughCache: a give-back through the cache of units
// taken before a reset, which the cache's lease cannot take back (the
// reset forgot the lease), goes to the store naming the state that took
// them, and the store drops it: the key admits its limit after the
// reset, on a clock that stands still, for every algorithm that leases.
func TestResetGiveBackThroughCache(t *testing.T) {
	for _, alg := range limiter.Algorithms {
		if !alg.Traits().Leases {
			continue
		}
		p := limiter.Policy{Algorithm: alg, Events: 5, Window: time.Hour}
		t.Run(string(alg), func(t *testing.T) {
			onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
				cache := edgeCaches(t, shared, p, clock, 1, 0.5)[0]
				ctx := context.Background()
				before := storetest.MustAdmit(t, cache, "k")
				if _, err := cache.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				n := admitAll(t, cache, "k", p.Events)
				if n != p.Events {
					t.Fatalf("admitted %d after the reset, want %d", n, p.Events)
				}
				if _, err := cache.GiveBack(ctx, "k", 1, before.Receipt); err != nil {
					t.Fatal(err)
				}
				if more := admitAll(t, cache, "k", p.Events); more != 0 {
					t.Errorf("admitted %d more after a give-back of a unit taken before the reset, want none", more)
				}
			})
		})
	}
}

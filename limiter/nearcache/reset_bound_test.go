package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestResetGiveBackOfForgottenRefill: a take whose lease was decided on
// the state an admin reset then erased is admitted, and holds its cost of
// the store (refill, case forgotten). When another zone refuses the
// request, the admission gives that cost back, naming the erased state
// (Receipt.Epoch): the store drops it, since the fresh state never
// counted it, and the key admits its limit after the reset, not a unit
// more.
func TestResetGiveBackOfForgottenRefill(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			h := newHeldReply(backend(t, p, clock))
			cache := edgeCaches(t, h, p, clock, 1, 1)[0]
			for range 3 {
				storetest.MustAdmit(t, cache, "k")
			}
			ctx := context.Background()
			h.arm()
			done := make(chan limiter.Admission, 1)
			go func() {
				a, err := cache.Take(ctx, "k", 1)
				if err != nil {
					t.Error(err)
				}
				done <- a
			}()
			<-h.decided
			if _, err := cache.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			close(h.release)
			a := <-done
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
}

// TestResetGiveBackInFlight: the same without a near cache: an admission
// taken before an admin reset and given back after it (another zone
// refused the request, or its response reported less) names the state
// that took it (Receipt.Epoch), and the fresh state, which never counted
// it, is not credited.
func TestResetGiveBackInFlight(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			s := backend(t, p, clock)
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
		for name, backend := range edgeBackends(t) {
			t.Run(string(alg)+"/"+name, func(t *testing.T) {
				clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
				cache := edgeCaches(t, backend(t, p, clock), p, clock, 1, 0.5)[0]
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
		}
	}
}

package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestReviewForgottenRefillGiveBack: a take whose lease was decided on
// the state an admin reset then erased is admitted, and holds its cost of
// the store (refill, case forgotten). When another zone refuses the
// request, the admission gives that cost back: into the fresh state,
// which never counted it, so one instance admits more than the fresh
// window's quota after the reset.
func TestReviewForgottenRefillGiveBack(t *testing.T) {
	p := Policy{Algorithm: FixedWindow, Events: 10, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			h := &heldReply{Leaser: backend(t, p, clock)}
			cache := edgeCaches(t, h, p, clock, 1, 1)[0]
			for range 3 {
				mustAdmit(t, cache, "k")
			}
			ctx := context.Background()
			h.arm()
			done := make(chan Admission, 1)
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
				mustAdmit(t, cache, "k")
			}
			if _, err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if got := 5 + admitAll(t, cache, "k", p.Events); got != p.Events {
				t.Errorf("admitted %d after the reset, want the fresh window's %d (the unit the erased state counted came back into the fresh one)", got, p.Events)
			}
		})
	}
}

// TestReviewGiveBackAfterResetCreditsFreshState: the same without a near
// cache: an admission taken before an admin reset and given back after it
// (another zone refused the request, or its response reported less) is
// credited to the fresh state, which never counted it. Concurrency guards
// against this with its state's epoch (Receipt.Mark); the window
// algorithms do not.
func TestReviewGiveBackAfterResetCreditsFreshState(t *testing.T) {
	p := Policy{Algorithm: FixedWindow, Events: 10, Window: time.Hour}
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			s := backend(t, p, clock)
			ctx := context.Background()
			a := mustAdmit(t, s, "k")
			if _, err := s.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				mustAdmit(t, s, "k")
			}
			if _, err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			n := int64(5)
			for range 20 {
				d, err := s.Take(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				n++
			}
			if n != p.Events {
				t.Errorf("admitted %d in the fresh window, want %d (a unit the erased state counted came back into it)", n, p.Events)
			}
		})
	}
}

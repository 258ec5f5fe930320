package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestCalendarLeaseEndsWithItsWindow: a lease granted just before local
// midnight is spent from only until midnight, and the first request of
// the new day goes to the store.
func TestCalendarLeaseEndsWithItsWindow(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Calendar: &limiter.Calendar{Period: limiter.Day, Location: testutil.MustLoad(t, "Europe/Berlin")}}
	midnight := time.Date(2026, 3, 30, 0, 0, 0, 0, testutil.MustLoad(t, "Europe/Berlin"))
	clock := testutil.NewClock(midnight.Add(-limiter.LeaseLifetime / 2))
	cache, store := newTestCache(t, p, clock, Options{LeaseFraction: 0.2})
	take := func() limiter.Decision { t.Helper(); return storetest.MustAdmit(t, cache, "k").Decision }
	for range 4 { // leases of 1 and 2 used up, then one of 4
		take()
	}
	if d := take(); d.Source != limiter.SourceLease || d.ResetAfter != limiter.LeaseLifetime/2 {
		t.Fatalf("%+v: want a lease decision resetting at midnight, %v away", d, limiter.LeaseLifetime/2)
	}
	clock.Advance(limiter.LeaseLifetime/2 - time.Microsecond)
	if d := take(); d.Source != limiter.SourceLease {
		t.Fatalf("just before midnight: source %v, want lease", d.Source)
	}
	clock.Advance(time.Microsecond)
	d := take()
	if d.Source != limiter.SourceStore || d.ResetAfter != 24*time.Hour {
		t.Fatalf("at midnight: %+v; want the store's decision, 24h to the next midnight", d)
	}
	if err := cache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Memory.Take(ctx, "k", 1); st.Remaining != 100-2 {
		t.Fatalf("the new day has %d left after Close, want 98", st.Remaining)
	}
}

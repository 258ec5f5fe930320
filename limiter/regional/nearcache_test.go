package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/nearcache"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
)

// TestNearCacheLeaseEndsWithTheRegionsWindow: a near cache in front of a
// region leases from the region's batch, and its lease ends at the end of
// the window global granted the batch in: the region's decisions report
// global's time, so the cache finds the window's end as it does over
// Redis.
func TestNearCacheLeaseEndsWithTheRegionsWindow(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: 10 * time.Second}
	end := storetest.AlignedBase(p) + p.Window.Microseconds()
	clock := testutil.NewClock(time.UnixMicro(end - 300_000))
	global, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	s, err := regional.New(global, regional.NewMemoryPool(clock), p, regional.Options{RegionQuota: 0.5, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	cache, err := nearcache.New(s, p, nearcache.Options{LeaseFraction: 0.2, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cache.Close(ctx) }()
	for range 4 { // leases of 1 and 2 used up, then one of 4
		storetest.MustAdmit(t, cache, "k")
	}
	if a := storetest.MustAdmit(t, cache, "k"); a.Source != limiter.SourceLease || a.ResetAfter != 300*time.Millisecond {
		t.Fatalf("%+v: want a lease decision resetting at the window's end, 300ms away", a.Decision)
	}
	clock.Advance(300*time.Millisecond - time.Microsecond)
	if a := storetest.MustAdmit(t, cache, "k"); a.Source != limiter.SourceLease {
		t.Fatalf("just before the window's end: source %v, want lease", a.Source)
	}
	clock.Advance(time.Microsecond)
	a := storetest.MustAdmit(t, cache, "k")
	if a.Source != limiter.SourceStore || a.ResetAfter != p.Window {
		t.Fatalf("at the window's end: %+v; want the region's decision of a new window", a.Decision)
	}
}

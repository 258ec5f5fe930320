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
	clock := testutil.NewClock(time.UnixMicro(end - 500_000))
	global, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	s, err := regional.New(global, regional.NewMemoryPool(clock), p, regional.Options{RegionQuota: 0.5, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	// Another instance's requests leave the region a batch of 4 with 3
	// units, granted 500ms before the window's end.
	for range 4 {
		storetest.MustAdmit(t, s, "k")
	}
	clock.Advance(200 * time.Millisecond)
	cache, err := nearcache.New(s, p, nearcache.Options{LeaseFraction: 0.2, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cache.Close(ctx) }()
	storetest.MustAdmit(t, cache, "k")      // a lease of 1, from the region's batch
	a := storetest.MustAdmit(t, cache, "k") // a lease of 2, one left
	if a.ResetAfter != 300*time.Millisecond {
		t.Fatalf("%+v: want the region's decision resetting at the window's end, 300ms away", a.Decision)
	}
	clock.Advance(300 * time.Millisecond)
	a = storetest.MustAdmit(t, cache, "k")
	if a.Source == limiter.SourceLease || a.ResetAfter != p.Window {
		t.Fatalf("at the window's end: %+v; want the region's decision of a new window, not the lease of the last", a.Decision)
	}
}

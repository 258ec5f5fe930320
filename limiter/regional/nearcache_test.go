package regional_test

import (
	"context"
	"sync/atomic"
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

// countingRegion is a region's store that counts the calls a near cache
// in front of it makes.
type countingRegion struct {
	*regional.Store
	takes, returns atomic.Int64
}

func (c *countingRegion) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	c.takes.Add(1)
	return c.Store.TakeUpTo(ctx, key, cost, want)
}

func (c *countingRegion) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	c.takes.Add(1)
	c.returns.Add(1)
	return c.Store.Renew(ctx, back, cost, want)
}

func (c *countingRegion) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	c.returns.Add(1)
	return c.Store.ReturnMany(ctx, returns)
}

// regionBehindCache opens a region of p (a memory pool, region_quota 0.5)
// over global and a near cache of leases of up to 5% of the quota in
// front of it, all on clock; the cache is closed before the region when
// the test ends.
func regionBehindCache(t *testing.T, global limiter.Leaser, p limiter.Policy, clock limiter.Clock) (*nearcache.Cache, *countingRegion) {
	t.Helper()
	s, err := regional.New(global, regional.NewMemoryPool(clock), p, regional.Options{RegionQuota: 0.5, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	region := &countingRegion{Store: s}
	cache, err := nearcache.New(region, p, nearcache.Options{LeaseFraction: 0.05, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cache.Close(context.Background())
		_ = s.Close(context.Background())
	})
	return cache, region
}

// TestNearCacheRefillsAheadFromARegion: a busy key of a near cache in
// front of a region is refilled ahead from the region's units, as over
// Redis: after its first leases in a row, no request waits for the
// region; and every unit it did not spend goes back through the region
// to global once both close.
func TestNearCacheRefillsAheadFromARegion(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1000, Window: time.Hour}
	clock := testutil.NewClock(time.UnixMicro(storetest.AlignedBase(p) + time.Second.Microseconds()))
	global, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	cache, region := regionBehindCache(t, global, p, clock)
	fromRegion := 0
	for range 100 {
		if a := storetest.MustAdmit(t, cache, "k"); a.Source == limiter.SourceStore {
			fromRegion++
		}
	}
	// Leases of 1, 2, 4 and 8 in a row, then every lease refilled ahead.
	if fromRegion != 4 {
		t.Errorf("%d of 100 requests waited for the region, want the first 4 leases' only", fromRegion)
	}
	if err := cache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := region.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := global.Peek(ctx, "k"); d.Remaining != 1000-100 {
		t.Fatalf("global has %d left once the cache and the region closed, want %d: every unit but the 100 spent back", d.Remaining, 1000-100)
	}
}

// TestNearCacheRefillsNoSlidingLogAheadFromARegion: a region grants a
// sliding log's lease its cost alone, never logged ahead
// (regional.Store.TakeUpTo), so a near cache in front starts no refill
// ahead, which would come back with units it must give back at once: one
// call per request, and no give-back.
func TestNearCacheRefillsNoSlidingLogAheadFromARegion(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 1000, Window: time.Minute}
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	global, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	cache, region := regionBehindCache(t, global, p, clock)
	for range 20 {
		storetest.MustAdmit(t, cache, "k")
	}
	if err := cache.Close(ctx); err != nil { // waits for refills ahead
		t.Fatal(err)
	}
	if takes, returns := region.takes.Load(), region.returns.Load(); takes != 20 || returns != 0 {
		t.Fatalf("20 requests made %d leases and %d returns in the region, want 20 and none", takes, returns)
	}
}

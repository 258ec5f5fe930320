package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// newTestTier puts a LocalTier in front of a memory store that stands for
// the shared one, both on clock, and closes it when the test ends.
func newTestTier(t *testing.T, p Policy, clock *testutil.Clock, opts LocalTierOptions) (*LocalTier, *countingLeaser) {
	t.Helper()
	shared, err := NewMemory(p, MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	store := &countingLeaser{Memory: shared}
	opts.Clock = clock
	tier, err := NewLocalTier(store, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close(context.Background()) })
	return tier, store
}

// countingLeaser is a memory store that counts the calls a tier makes and
// records the size of each lease it asks for.
type countingLeaser struct {
	*Memory
	mu      sync.Mutex
	wants   []int64
	takes   atomic.Int64
	renews  atomic.Int64
	refunds atomic.Int64
	// refunded is the units given back.
	refunded atomic.Int64
}

func (c *countingLeaser) TakeUpTo(ctx context.Context, key string, cost, want int64) (Decision, error) {
	c.mu.Lock()
	c.wants = append(c.wants, want)
	c.mu.Unlock()
	return c.Memory.TakeUpTo(ctx, key, cost, want)
}

func (c *countingLeaser) Take(ctx context.Context, key string, cost int64) (Decision, error) {
	c.takes.Add(1)
	return c.Memory.Take(ctx, key, cost)
}

func (c *countingLeaser) Refund(ctx context.Context, key string, cost int64, taken Decision) (Decision, error) {
	c.refunds.Add(1)
	c.refunded.Add(cost)
	return c.Memory.Refund(ctx, key, cost, taken)
}

// Renew counts as the refund and the lease it is, and as a renewal.
func (c *countingLeaser) Renew(ctx context.Context, back Refund, cost, want int64) (Decision, error) {
	c.renews.Add(1)
	_, _ = c.Refund(ctx, back.Key, back.Cost, back.Taken)
	return c.TakeUpTo(ctx, back.Key, cost, want)
}

// RefundMany counts as the refunds it is.
func (c *countingLeaser) RefundMany(ctx context.Context, refunds []Refund) error {
	for _, r := range refunds {
		_, _ = c.Refund(ctx, r.Key, r.Cost, r.Taken)
	}
	return nil
}

func (c *countingLeaser) leaseSizes() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.wants...)
}

// TestLeaseSizing: a lease starts at the cost, doubles while each is used
// up within a second of its grant, stops at ⌈fraction × Q⌉, and restarts
// at the cost for a key not leased for a while.
func TestLeaseSizing(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	p := Policy{Algorithm: FixedWindow, Events: 1000, Window: time.Hour}
	tier, store := newTestTier(t, p, clock, LocalTierOptions{LeaseFraction: 0.05}) // at most 50
	for i := range 200 {
		d, err := tier.Take(ctx, "k", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
		clock.Advance(time.Millisecond)
	}
	want := []int64{1, 2, 4, 8, 16, 32, 50, 50, 50}
	if got := store.leaseSizes(); !slices.Equal(got, want) {
		t.Fatalf("lease sizes %v, want %v", got, want)
	}
	// 1+2+4+8+16+32+50+50+50 = 213 taken from the store for 200 admitted.
	if d, _ := store.Memory.Take(ctx, "k", 1); d.Remaining != 1000-213-1 {
		t.Fatalf("the store has %d left, want %d", d.Remaining, 1000-213-1)
	}
	// Not leased for a while: the next lease starts at the cost again.
	clock.Advance(3 * LeaseLifetime)
	if _, err := tier.Take(ctx, "k", 3); err != nil {
		t.Fatal(err)
	}
	if got := store.leaseSizes(); got[len(got)-1] != 3 {
		t.Fatalf("lease after a pause: %d, want the cost, 3", got[len(got)-1])
	}
}

// TestLeaseExpiry: a lease is spent from for at most LeaseLifetime, a
// fixed window's never past its window's end; then its unspent units go
// back to the store, and Close gives back the rest.
func TestLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			p := Policy{Algorithm: alg, Events: 100, Window: time.Hour}
			// Half a second before a window boundary.
			clock := testutil.NewClock(time.Unix(0, 0).Add(500 * time.Hour).Add(-LeaseLifetime / 2))
			tier, store := newTestTier(t, p, clock, LocalTierOptions{LeaseFraction: 0.2})
			take := func() Decision {
				t.Helper()
				d, err := tier.Take(ctx, "k", 1)
				if err != nil || !d.Allowed {
					t.Fatalf("take: %+v, %v", d, err)
				}
				return d
			}
			for range 4 { // leases of 1 and 2 used up, then one of 4
				take()
			}
			d := take() // spent from the lease of 4: 2 left in it
			if d.Source != SourceLease {
				t.Fatalf("source %v, want lease", d.Source)
			}
			// What the store had left after the grant plus the lease's 2.
			if d.Remaining != 100-7+2 {
				t.Fatalf("remaining %d, want %d", d.Remaining, 100-7+2)
			}
			expires := LeaseLifetime
			if alg == FixedWindow {
				expires = LeaseLifetime / 2 // the window ends first
			}
			clock.Advance(expires - time.Microsecond)
			if d := take(); d.Source != SourceLease {
				t.Fatalf("just before expiry: source %v, want lease", d.Source)
			}
			clock.Advance(time.Microsecond)
			tier.sweep(false)
			tier.givingBack.Wait()
			if got := store.refunded.Load(); got != 1 {
				t.Fatalf("gave back %d units at expiry, want the 1 unspent", got)
			}
			if d := take(); d.Source != SourceStore {
				t.Fatalf("after expiry: source %v, want store", d.Source)
			}
			if err := tier.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// Every admitted unit, and only those, is taken in the store.
			admitted := int64(7)
			if alg == FixedWindow {
				admitted = 1 // a new window began at the expiry
			}
			if st, _ := store.Memory.Take(ctx, "k", 1); st.Remaining != 100-admitted-1 {
				t.Fatalf("store has %d left after Close, want %d", st.Remaining, 100-admitted-1)
			}
		})
	}
}

// TestLeaseRenewal: a lease too short for a request's cost gives its
// leftover back in the call that takes the next lease, so the new lease
// can use those units and nothing is stranded or counted twice.
func TestLeaseRenewal(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	p := Policy{Algorithm: FixedWindow, Events: 100, Window: time.Hour}
	tier, store := newTestTier(t, p, clock, LocalTierOptions{LeaseFraction: 0.1})
	for range 2 { // leases of 1 and 2: 1 left in the last
		if d, err := tier.Take(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("take: %+v, %v", d, err)
		}
	}
	d, err := tier.Take(ctx, "k", 5)
	if err != nil || !d.Allowed || d.Source != SourceStore {
		t.Fatalf("take of 5: %+v, %v", d, err)
	}
	if n, back := store.renews.Load(), store.refunded.Load(); n != 1 || back != 1 {
		t.Fatalf("%d renewals giving back %d units, want 1 giving back the 1 left", n, back)
	}
	// 1 + 2 leased, 1 given back, 5 leased (a lease of 4 doubled, raised
	// to the cost): 7 taken in the store, all spent.
	if d.Remaining != 100-7 {
		t.Fatalf("remaining %d, want %d", d.Remaining, 100-7)
	}
	if st, _ := store.Memory.Peek(ctx, "k"); st.Remaining != 100-7 {
		t.Fatalf("the store has %d left, want %d", st.Remaining, 100-7)
	}
}

// TestLeaseRefund: units refunded (another zone refused the request) go
// back into the lease they came from, with no call to the store; once the
// lease is gone they go back to the store.
func TestLeaseRefund(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	p := Policy{Algorithm: SlidingWindowLog, Events: 10, Window: time.Minute}
	tier, store := newTestTier(t, p, clock, LocalTierOptions{LeaseFraction: 1})
	var last Decision
	for range 4 { // leases of 1, 2 and 4: 3 left in the last
		last, _ = tier.Take(ctx, "k", 1)
	}
	d, err := tier.Refund(ctx, "k", 1, last)
	if err != nil || store.refunds.Load() != 0 {
		t.Fatalf("refund into the lease: %v, %d calls to the store", err, store.refunds.Load())
	}
	if d.Remaining != 10-7+4 {
		t.Fatalf("remaining after the refund %d, want %d", d.Remaining, 10-7+4)
	}
	clock.Advance(LeaseLifetime)
	tier.sweep(false)
	tier.givingBack.Wait()
	if _, err := tier.Refund(ctx, "k", 1, last); err != nil {
		t.Fatal(err)
	}
	if got := store.refunded.Load(); got != 5 {
		t.Fatalf("%d units back in the store, want 4 unspent and 1 refunded", got)
	}
	// 7 taken, 4 unspent and 1 refunded twice (once into the lease, once
	// to the store).
	if st, _ := store.Memory.Take(ctx, "k", 1); st.Remaining != 10-2-1 {
		t.Fatalf("store has %d left, want %d", st.Remaining, 10-2-1)
	}
}

// TestDenyCache: a refusal is repeated from memory, its times counted
// down, until the smaller of its Retry-After and the cache's duration.
func TestDenyCache(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		denyFor time.Duration
		lease   float64
		until   time.Duration // how long the refusal is repeated
	}{
		{"short cache", 200 * time.Millisecond, 0, 200 * time.Millisecond},
		{"retry-after first", time.Hour, 0, 3 * time.Second},
		{"with leases", 200 * time.Millisecond, 0.5, 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			// One token per 3 s: a refusal's Retry-After is under 3 s.
			p := Policy{Algorithm: TokenBucket, Events: 2, Window: 6 * time.Second}
			tier, store := newTestTier(t, p, clock, LocalTierOptions{DenyFor: c.denyFor, LeaseFraction: c.lease})
			for range 2 {
				tier.Take(ctx, "k", 1)
			}
			first, _ := tier.Take(ctx, "k", 1)
			if first.Allowed || first.Source != SourceStore || first.RetryAfter != 3*time.Second {
				t.Fatalf("first refusal %+v", first)
			}
			calls := store.takes.Load() + int64(len(store.leaseSizes()))
			clock.Advance(c.until - time.Millisecond)
			d, _ := tier.Take(ctx, "k", 1)
			if d.Allowed || d.Source != SourceDenyCache {
				t.Fatalf("within the cache: %+v", d)
			}
			if want := first.RetryAfter - c.until + time.Millisecond; d.RetryAfter != want {
				t.Fatalf("cached Retry-After %v, want %v (counted down)", d.RetryAfter, want)
			}
			if want := first.ResetAfter - c.until + time.Millisecond; d.ResetAfter != want {
				t.Fatalf("cached reset %v, want %v (counted down)", d.ResetAfter, want)
			}
			if got := store.takes.Load() + int64(len(store.leaseSizes())); got != calls {
				t.Fatalf("the store was asked %d more times", got-calls)
			}
			clock.Advance(time.Millisecond)
			d, _ = tier.Take(ctx, "k", 1)
			if d.Source != SourceStore {
				t.Fatalf("after the cache: %+v, want a decision of the store", d)
			}
		})
	}
}

// TestLocalTiersNeverOverAdmit races three tiers (three instances) over one
// shared store and checks that they admit at most the limit together, and
// that after Close every unit not admitted is back in the store.
func TestLocalTiersNeverOverAdmit(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			const limit = 100
			p := Policy{Algorithm: alg, Events: limit, Window: time.Hour}
			clock := testutil.NewClock(time.Unix(0, 0).Add(500*time.Hour + time.Minute))
			shared, err := NewMemory(p, MemoryOptions{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			var tiers []*LocalTier
			for range 3 {
				tier, err := NewLocalTier(shared, p, LocalTierOptions{LeaseFraction: 0.2, DenyFor: time.Second, Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				tiers = append(tiers, tier)
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := range 600 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := tiers[i%3].Take(ctx, "k", 1)
					if err != nil {
						t.Error(err)
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}()
			}
			wg.Wait()
			if n := admitted.Load(); n > limit || n < limit-2*20 {
				t.Fatalf("admitted %d, want at most %d and at least %d", n, limit, limit-2*20)
			}
			for _, tier := range tiers {
				if err := tier.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			st, _ := shared.Take(ctx, "k", 1)
			left := st.Remaining
			if st.Allowed {
				left++
			}
			if left != limit-admitted.Load() {
				t.Fatalf("store has %d left after Close, want %d", left, limit-admitted.Load())
			}
		})
	}
}

// TestLocalTierRedisAccuracy is three instances, each a LocalTier with
// leases on a Redis store of its own client, on one Redis: 600 concurrent
// requests for one key admit at most the limit of 100 (60 admit 60); once
// the leases have lapsed and gone back, a second wave of 300 brings the
// total to exactly 100, so no unit was stranded. On a standalone Redis and
// on a Cluster.
func TestLocalTierRedisAccuracy(t *testing.T) {
	servers := []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{redistest.Start(t).Addr()} }},
		{"cluster", func(t *testing.T) []string { return redistest.StartCluster(t, 3).Addrs() }},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			addrs := srv.addrs(t)
			clients := make([]redis.UniversalClient, 3)
			for i := range clients {
				c, err := RedisConfig{Addresses: addrs}.NewClient()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				clients[i] = c
			}
			// A window must not turn over mid-test.
			if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < 30*time.Second {
				time.Sleep(left + time.Second)
			}
			for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
				// A first wave short of the limit leaves units in every
				// lease, which only their give-back returns.
				for _, first := range []int{600, 60} {
					t.Run(fmt.Sprintf("%s/%d", alg, first), func(t *testing.T) {
						checkTierAccuracy(t, clients, Policy{Algorithm: alg, Events: 100, Window: time.Hour}, first)
					})
				}
			}
		})
	}
}

func checkTierAccuracy(t *testing.T, clients []redis.UniversalClient, p Policy, firstWave int) {
	ctx := context.Background()
	const quota = 100
	tiers := make([]*LocalTier, len(clients))
	for i, c := range clients {
		// A generous timeout: this test is about counting, and a loaded
		// machine must not turn decisions into failures.
		store := newTestRedis(t, c, p, RedisOptions{Zone: "tier-accuracy", Timeout: 5 * time.Second})
		tier, err := NewLocalTier(store, p, LocalTierOptions{LeaseFraction: 0.2, DenyFor: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tier.Close(ctx) })
		tiers[i] = tier
	}
	key := fmt.Sprintf("k-%d", time.Now().UnixNano())
	wave := func(n int) int64 {
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := tiers[i%len(tiers)].Take(ctx, key, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
		return admitted.Load()
	}
	first := wave(firstWave)
	if first > quota || (firstWave < quota && first != int64(firstWave)) {
		t.Fatalf("first wave of %d admitted %d, limit %d", firstWave, first, quota)
	}
	testutil.Eventually(t, "the leases to lapse and be given back", func() error {
		for i, tier := range tiers {
			if units := tier.held(); units > 0 {
				return fmt.Errorf("instance %d holds %d units", i, units)
			}
		}
		return nil
	})
	// Give-backs already taken from the leases may still be on their way.
	for _, tier := range tiers {
		tier.givingBack.Wait()
	}
	// Past the denial cache too, so the second wave asks Redis again.
	time.Sleep(time.Second)
	second := wave(300)
	if total := first + second; total != quota {
		t.Fatalf("admitted %d then %d: %d in all, want exactly %d", first, second, total, quota)
	}
	t.Logf("admitted %d, then %d", first, second)
}

// held is how many units the tier's leases hold, for tests that wait for
// them to go back.
func (t *LocalTier) held() (units int64) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, k := range sh.keys {
			units += k.units
		}
		sh.mu.Unlock()
	}
	return units
}

package regional_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/delayproxy"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
)

// globalDelay is the delay each way between every instance and the global
// Redis: a region a continent away.
const globalDelay = 30 * time.Millisecond

// regionsHarness is one global redis-server behind a delay proxy and two
// regional ones, each region with two instances.
type regionsHarness struct {
	global       *redistest.Server
	globalAddr   string
	regions      [2]*redistest.Server
	globalClient redis.UniversalClient
}

func startRegions(t *testing.T) *regionsHarness {
	t.Helper()
	h := &regionsHarness{global: redistest.Start(t)}
	px, err := delayproxy.Start(h.global.Addr(), globalDelay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	h.globalAddr = px.Addr()
	for i := range h.regions {
		h.regions[i] = redistest.Start(t)
	}
	h.globalClient = h.global.Client(t)
	return h
}

func newClient(t *testing.T, addr string) redis.UniversalClient {
	t.Helper()
	c, err := redisstore.Config{URL: "redis://" + addr}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// instance is one instance's store of zone enforcing p in region r: its
// own clients to global (through the proxy) and to its region.
func (h *regionsHarness) instance(t *testing.T, r int, zone string, p limiter.Policy, quota float64) *regional.Store {
	t.Helper()
	g, err := redisstore.New(newClient(t, h.globalAddr), p, redisstore.Options{Zone: zone, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A second for the region too: the suite runs this beside other
	// packages under the race detector, where 100 ms failed decisions.
	pool, err := redisstore.NewPool(newClient(t, h.regions[r].Addr()), p, redisstore.Options{Zone: zone, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := regional.New(g, pool, p, regional.Options{RegionQuota: quota, LockFor: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// timeTakes takes n units of key "k" from s (what, in a failure) one at a
// time and sorts their latencies: refills, which waited for global's round
// trip (2 × globalDelay), and the rest, decided from the region's pool;
// calls is the number of scripts global ran meanwhile.
func (h *regionsHarness) timeTakes(t *testing.T, what string, s *regional.Store, n int) (pooled, refills []time.Duration, calls int64) {
	t.Helper()
	ctx := context.Background()
	calls0, err := storetest.ScriptCalls(ctx, h.globalClient)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		t0 := time.Now()
		if a, err := s.Take(ctx, "k", 1); err != nil || !a.Allowed {
			t.Fatalf("%s: take %d: %+v %v", what, i+1, a, err)
		}
		if d := time.Since(t0); d >= 2*globalDelay {
			refills = append(refills, d)
		} else {
			pooled = append(pooled, d)
		}
	}
	calls1, err := storetest.ScriptCalls(ctx, h.globalClient)
	if err != nil {
		t.Fatal(err)
	}
	return pooled, refills, calls1 - calls0
}

// burst sends n requests of cost 1 for key, spread over the stores from
// eight goroutines each, and counts those admitted.
func burst(t *testing.T, stores []*regional.Store, key string, n int) int64 {
	t.Helper()
	var admitted, failed atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	goroutines := len(stores) * 8
	for i, s := range stores {
		for j := range 8 {
			// n/goroutines each, and one more for the first n%goroutines.
			per := n / goroutines
			if i*8+j < n%goroutines {
				per++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					a, err := s.Take(context.Background(), key, 1)
					switch {
					case err != nil:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, &err)
					case a.Allowed:
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed; the first: %v", failed.Load(), n, *firstErr.Load())
	}
	return admitted.Load()
}

// TestRegionsExactOverRedis: four instances over two regional redis-servers
// share one limit of 100 held by a global redis-server 30 ms away each
// way. 600 concurrent requests admit at most 100; once every region's idle
// units have lapsed and gone back to global, 300 more bring the total to
// exactly 100 (the token bucket: what it refilled meanwhile more), and
// global then has nothing left.
func TestRegionsExactOverRedis(t *testing.T) {
	storetest.AwayFromHourEnd()
	if left := 24*time.Hour - time.Duration(time.Now().UnixNano())%(24*time.Hour); left < time.Minute {
		time.Sleep(left + time.Second) // the calendar day must not turn over
	}
	h := startRegions(t)
	for _, p := range []limiter.Policy{
		{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour},
		{Algorithm: limiter.FixedWindow, Events: 100, Calendar: &limiter.Calendar{Period: limiter.Day}},
		{Algorithm: limiter.SlidingWindowLog, Events: 100, Window: time.Hour},
		{Algorithm: limiter.SlidingWindowCounter, Events: 100, Window: time.Hour},
		{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour},
	} {
		name := string(p.Algorithm)
		if p.Calendar != nil {
			name += "-calendar"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			zone := "z-" + name
			var stores []*regional.Store
			for r := range 2 {
				for range 2 {
					stores = append(stores, h.instance(t, r, zone, p, 0.3))
				}
			}
			start := time.Now()
			first := burst(t, stores, "k", 600)
			if first > 100 {
				t.Fatalf("600 requests over four instances in two regions admitted %d, limit 100", first)
			}
			// The batches lapse within a lifetime and the janitors return
			// them within a quarter lifetime more.
			time.Sleep(regional.Lifetime + regional.Lifetime/2)
			second := burst(t, stores, "k", 304)
			total := first + second
			var refilled int64
			if p.Algorithm == limiter.TokenBucket {
				refilled = int64(time.Since(start)/(36*time.Second)) + 1
			}
			if total < 100 || total > 100+refilled {
				t.Fatalf("admitted %d then %d: %d in all, want exactly 100 (+%d refilled)", first, second, total, refilled)
			}
			// Idle units of one region go back to global and serve the
			// other: 64 requests over all four instances leave the
			// regions holding units; region 0 alone then gets at most
			// what region 1 does not hold, and after region 1's batch
			// has lapsed and returned, exactly the rest.
			if got := burst(t, stores, "k2", 64); got != 64 {
				t.Fatalf("64 requests admitted %d, want all", got)
			}
			alone := burst(t, stores[:2], "k2", 304)
			time.Sleep(regional.Lifetime + regional.Lifetime/2)
			later := burst(t, stores[:2], "k2", 304)
			refilled = 0
			if p.Algorithm == limiter.TokenBucket {
				refilled = int64(time.Since(start)/(36*time.Second)) + 1
			}
			if got := 64 + alone + later; got < 100 || got > 100+refilled {
				t.Fatalf("64 admitted over both regions, then region 0 alone %d, and %d once region 1's units returned: %d in all, want 100 (+%d refilled)", alone, later, got, refilled)
			}
			if alone >= 36 && p.Algorithm != limiter.TokenBucket {
				t.Errorf("region 0 alone got %d of the 36 left while region 1 held units: the test shows no return", alone)
			}
			for _, s := range stores {
				if err := s.Close(context.Background()); err != nil {
					t.Error(err)
				}
			}
			t.Logf("%s: %d admitted in the first burst, %d in the second; 64, then %d in region 0 alone, %d once region 1's units returned", name, first, second, alone, later)
		})
	}
}

// TestRegionsRefillAcrossTheDelay: a decision from the region's pool costs
// a regional round trip, not the global one; the one that refills pays the
// global round trip.
func TestRegionsRefillAcrossTheDelay(t *testing.T) {
	storetest.AwayFromHourEnd()
	h := startRegions(t)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1000, Window: time.Hour}
	s := h.instance(t, 0, "latency", p, 0.5)
	defer func() { _ = s.Close(context.Background()) }()
	fast, slow, calls := h.timeTakes(t, "latency", s, 200)
	if len(slow) == 0 || int64(len(slow)) > calls {
		t.Fatalf("%d decisions waited for global, which ran %d scripts", len(slow), calls)
	}
	if len(slow) > 12 {
		t.Fatalf("%d of 200 decisions waited for global: batches should double up to 500", len(slow))
	}
	t.Logf("%d decisions from the pool, %d refills across the delay; %d global script calls for 200 decisions", len(fast), len(slow), calls)
}

// TestRegionsSpendWhatTheyHoldWhenGlobalIsDown: with global stopped, a
// region admits exactly the units its pool holds, then fails (the zone's
// fail mode decides).
func TestRegionsSpendWhatTheyHoldWhenGlobalIsDown(t *testing.T) {
	storetest.AwayFromHourEnd()
	h := startRegions(t)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1000, Window: time.Hour}
	s := h.instance(t, 0, "down", p, 0.5)
	ctx := context.Background()
	for range 40 {
		storetest.MustAdmit(t, s, "k")
	}
	in, err := s.Inspect(ctx, "k")
	if err != nil || in.Units == 0 {
		t.Fatalf("the pool holds %+v (%v); want units", in, err)
	}
	h.global.Stop()
	for i := range in.Units {
		if a, err := s.Take(ctx, "k", 1); err != nil || !a.Allowed {
			t.Fatalf("take %d of the %d units held, global down: %+v %v", i+1, in.Units, a, err)
		}
	}
	if a, err := s.Take(ctx, "k", 1); err == nil {
		t.Fatalf("a take past the pool's units with global down: %+v, want an error", a)
	}
}

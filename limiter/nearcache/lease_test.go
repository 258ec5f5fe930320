package nearcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// The paths a lease takes at its edges: where its units are counted, when
// it ends, and where a refund of them goes. Each test here failed before
// the fix it names; the model test (model_test.go) searches the same
// ground at random.

// edgeBackends are the shared stores the edge tests run over: one memory
// store, and Redis when redis-server is on the PATH. Each returns a fresh
// Leaser for p on clock, shared by every cache the test builds.
func edgeBackends(t *testing.T) map[string]func(t *testing.T, p limiter.Policy, clock limiter.Clock) limiter.Leaser {
	backends := map[string]func(t *testing.T, p limiter.Policy, clock limiter.Clock) limiter.Leaser{
		"memory": func(t *testing.T, p limiter.Policy, clock limiter.Clock) limiter.Leaser {
			return newTestMemory(t, p, clock)
		},
	}
	if redistest.Available() {
		s := redistest.Start(t)
		client := s.Client(t)
		n := 0
		backends["redis"] = func(t *testing.T, p limiter.Policy, clock limiter.Clock) limiter.Leaser {
			n++
			return newTestRedis(t, client, p, redisstore.Options{Zone: fmt.Sprintf("edge%d", n), Timeout: 5 * time.Second, Clock: clock})
		}
	}
	return backends
}

// onEdgeBackends runs f as a subtest on each of edgeBackends: shared is
// a store of p on a clock of its own, which stands still until the test
// moves it.
func onEdgeBackends(t *testing.T, p limiter.Policy, f func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock)) {
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
			f(t, backend(t, p, clock), clock)
		})
	}
}

// edgeCaches puts n NearCaches (n instances) in front of store, sweeping
// only when the test says.
func edgeCaches(t *testing.T, store limiter.Leaser, p limiter.Policy, clock limiter.Clock, n int, fraction float64) []*Cache {
	t.Helper()
	caches := make([]*Cache, n)
	for i := range caches {
		caches[i] = openCache(t, store, p, Options{LeaseFraction: fraction, Clock: clock, manualSweep: true})
	}
	return caches
}

// driveBursts sends bursts of unit requests, as clients do: each step
// moves the clock on by up to maxGap, then one instance (at random) sends
// up to maxBurst requests at once, and now and then an instance sweeps.
// It returns the admissions, each at the time it was answered.
func driveBursts(t *testing.T, caches []*Cache, clock *testutil.Clock, seed uint64, steps int, maxGap time.Duration, maxBurst int) []admission {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 17))
	var adm []admission
	for range steps {
		clock.Advance(time.Duration(rng.Int64N(int64(maxGap))))
		cache := caches[rng.IntN(len(caches))]
		if rng.IntN(4) == 0 {
			cache.sweep(false)
		}
		for range 1 + rng.IntN(maxBurst) {
			d, err := cache.Take(ctx, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				adm = append(adm, admission{clock.Now().UnixMicro(), 1})
			}
		}
	}
	return adm
}

// admission is a request's units, admitted at a time in µs.
type admission struct{ at, units int64 }

// mostInSpan is the most units admitted in any span (t − w, t].
func mostInSpan(adm []admission, w int64) int64 {
	sort.Slice(adm, func(i, j int) bool { return adm[i].at < adm[j].at })
	var most, in int64
	first := 0
	for _, a := range adm {
		in += a.units
		for adm[first].at <= a.at-w {
			in -= adm[first].units
			first++
		}
		most = max(most, in)
	}
	return most
}

// mostInWindow is the most units admitted in one aligned window [kw, (k+1)w).
func mostInWindow(adm []admission, w int64) int64 {
	per := map[int64]int64{}
	var most int64
	for _, a := range adm {
		per[a.at/w] += a.units
		most = max(most, per[a.at/w])
	}
	return most
}

// TestLeasedSlidingLogSpansHoldTheLimit: three instances lease a sliding
// log of 100/1m at local_quota 0.5 and spend steadily. Logged at their
// grant and spent up to a second later, lease units once let 136 pass
// in one 60-second span.
func TestLeasedSlidingLogSpansHoldTheLimit(t *testing.T) {
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			p := limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 100, Window: time.Minute}
			for seed := range uint64(5) {
				clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
				caches := edgeCaches(t, backend(t, p, clock), p, clock, 3, 0.5)
				adm := driveBursts(t, caches, clock, seed, 600, 800*time.Millisecond, 30)
				if most := mostInSpan(adm, p.Window.Microseconds()); most > p.Events {
					t.Errorf("seed %d: %d admitted in one 60s span, limit %d", seed, most, p.Events)
				}
			}
		})
	}
}

// slowReplies is a shared store whose answers reach the cache a while
// after the store decided, as a reply crossing the network does.
type slowReplies struct {
	limiter.Leaser
	clock *testutil.Clock
	delay time.Duration
}

func (s slowReplies) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	d, err := s.Leaser.TakeUpTo(ctx, key, cost, want)
	s.clock.Advance(s.delay)
	return d, err
}

func (s slowReplies) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	d, err := s.Leaser.Renew(ctx, back, cost, want)
	s.clock.Advance(s.delay)
	return d, err
}

// TestLeaseEndsAtItsWindowDespiteSlowReplies: a window counter's lease
// ends at the end of the window it was granted in, measured from when the
// request was sent. Measured from the reply, a 3ms reply across a window
// boundary let 131 pass in a window of 100.
func TestLeaseEndsAtItsWindowDespiteSlowReplies(t *testing.T) {
	for name, backend := range edgeBackends(t) {
		for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
			t.Run(name+"/"+string(alg), func(t *testing.T) {
				p := limiter.Policy{Algorithm: alg, Events: 100, Window: time.Second}
				for seed := range uint64(5) {
					clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
					store := slowReplies{Leaser: backend(t, p, clock), clock: clock, delay: 3 * time.Millisecond}
					caches := edgeCaches(t, store, p, clock, 3, 1)
					adm := driveBursts(t, caches, clock, seed, 600, 40*time.Millisecond, 30)
					if most := mostInWindow(adm, p.Window.Microseconds()); most > p.Events {
						t.Errorf("seed %d: %d admitted in one window, limit %d", seed, most, p.Events)
					}
				}
			})
		}
	}
}

// TestRefundAfterLeaseRenewed: a refund of a unit spent from a lease that
// has since been renewed reaches the store, for every algorithm that
// leases. The sliding log removes an entry only at its exact time, and
// the refund once named the spend's time, not the entry's: the refused
// request kept its unit for up to the window.
func TestRefundAfterLeaseRenewed(t *testing.T) {
	for name, backend := range edgeBackends(t) {
		for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow, limiter.SlidingWindowLog, limiter.SlidingWindowCounter} {
			t.Run(name+"/"+string(alg), func(t *testing.T) {
				ctx := context.Background()
				p := limiter.Policy{Algorithm: alg, Events: 10, Window: time.Hour}
				clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
				store := backend(t, p, clock)
				cache := edgeCaches(t, store, p, clock, 1, 1)[0]
				take := func() limiter.Admission {
					t.Helper()
					clock.Advance(10 * time.Millisecond)
					return storetest.MustAdmit(t, cache, "k")
				}
				take()          // a lease of 1
				take()          // a lease of 2: 1 left
				spent := take() // spent from it
				take()          // a lease of 4 replaces it
				if spent.Source != limiter.SourceLease {
					t.Fatalf("source %v, want lease", spent.Source)
				}
				clock.Advance(10 * time.Millisecond)
				if _, err := cache.GiveBack(ctx, "k", 1, spent.Receipt); err != nil {
					t.Fatal(err)
				}
				// Let the lease lapse and go back, then look at the store.
				clock.Advance(limiter.LeaseLifetime)
				cache.sweep(false)
				cache.givingBack.Wait()
				d, err := store.Peek(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				// Four requests passed and one was refunded; the bucket
				// refills a little over the 4.04s, so at least 7.
				if d.Remaining < p.Events-3 {
					t.Errorf("store has %d left, want %d: the refund was lost", d.Remaining, p.Events-3)
				}
			})
		}
	}
}

// TestRefundNeverLandsInALaterLease: a refund goes back into the lease
// its units came from, or to the store, never into a lease granted after
// the key was forgotten. Lease numbers once restarted with the key, so a
// refund of last window's admission topped up this window's lease and
// five passed in a window of four.
func TestRefundNeverLandsInALaterLease(t *testing.T) {
	for name, backend := range edgeBackends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 4, Window: 10 * time.Second}
			clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
			cache := edgeCaches(t, backend(t, p, clock), p, clock, 1, 1)[0]
			old, err := cache.Take(ctx, "k", 1)
			if err != nil || !old.Allowed {
				t.Fatalf("take: %+v, %v", old, err)
			}
			clock.Advance(12 * time.Second) // the next window; the key idles
			cache.sweep(false)
			cache.givingBack.Wait()
			admitted := 0
			for i := range 6 {
				d, err := cache.Take(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
				if i == 0 {
					// Another zone refused the old request only now.
					if _, err := cache.GiveBack(ctx, "k", 1, old.Receipt); err != nil {
						t.Fatal(err)
					}
				}
			}
			if admitted != 4 {
				t.Errorf("%d admitted in a window of 4", admitted)
			}
		})
	}
}

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

package limiter

import (
	"bufio"
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// The key population of BenchmarkLocalTierRedisZipf: zipfKeys keys, key i
// drawn with probability proportional to (zipfV + i)^-zipfS, as
// math/rand/v2's Zipf draws them.
const (
	zipfKeys = 100_000
	zipfS    = 1.1
	zipfV    = 1.0
)

// zipfRefusalShare is the share of decisions the benchmark's per-key limit
// is chosen to refuse.
const zipfRefusalShare = 0.1

// BenchmarkLocalTierRedisZipf counts the Redis round trips a LocalTier
// saves: four instances, each a Redis store on a client of its own behind
// a LocalTier with leases of up to a tenth of the quota and a 1 s denial
// cache, share one redis-server the benchmark starts. 64 callers
// (b.SetParallelism) make b.N decisions, each on one of 100,000 keys drawn
// from a Zipf distribution (s = 1.1), spread over the four instances in
// turn. The policy is a fixed window of an hour whose per-key limit is
// chosen from b.N so that about a tenth of the decisions would be
// refusals (see zipfLimit); the measured share is reported.
//
// Metrics: scripts/decision is the script calls Redis ran (INFO
// commandstats: EVALSHA, EVAL and their _RO forms), lease grants, refusals
// and give-backs alike, including those of Close at the end, per decision;
// the goal is at most 0.2. store/decision is the share of decisions the
// tier sent to Redis rather than answer from a lease or a cached refusal
// (the rest of scripts/decision are give-backs of unspent lease units);
// first/decision the share that were an instance's first decision of
// their key, which no tier can make without Redis: with 400,000 (key,
// instance) pairs that floor falls as b.N grows, so compare runs of the
// same -benchtime Nx. refused/decision is the share refused, limit/key
// the per-key limit chosen for b.N.
//
// The benchmark fails if any key was admitted more than its limit in any
// window, counted across the four instances: each admission is counted
// under the window its decision's ResetAfter ends.
func BenchmarkLocalTierRedisZipf(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client(b)
	ctx := context.Background()

	limit := zipfLimit(b.N, zipfRefusalShare)
	p := Policy{Algorithm: FixedWindow, Events: limit, Window: time.Hour}
	const instances = 4
	tiers := make([]*LocalTier, instances)
	for i := range tiers {
		c, err := RedisConfig{Addresses: []string{srv.Addr()}}.NewClient()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		// A generous timeout: this benchmark counts round trips, and a
		// loaded machine must not turn decisions into failures.
		store := newTestRedis(b, c, p, RedisOptions{Zone: "zipf", Timeout: 5 * time.Second})
		tier, err := NewLocalTier(store, p, LocalTierOptions{LeaseFraction: 0.1, DenyFor: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tier.Close(ctx) })
		tiers[i] = tier
		// Load the script into Redis and warm the client's connection,
		// on a key outside the population, before the count starts.
		if _, err := store.Take(ctx, "warm-up", 1); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([]string, zipfKeys)
	for i := range keys {
		keys[i] = "zipf-" + strconv.Itoa(i)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}

	var (
		mu        sync.Mutex
		admitted  = make(map[uint64]int64) // key index | window << 20
		refused   int64
		fromDeny  int64
		fromLease int64
		failures  atomic.Int64
		caller    atomic.Uint64
		// seen marks the keys each instance has decided, so the
		// decisions that were an instance's first of a key, which no
		// tier can answer without Redis, are counted apart.
		seen  = make([]atomic.Bool, instances*zipfKeys)
		first atomic.Int64
	)
	b.SetParallelism(32) // 64 callers on two CPUs
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := caller.Add(1)
		r := rand.New(rand.NewPCG(g, 0x5eed))
		z := rand.NewZipf(r, zipfS, zipfV, zipfKeys-1)
		mine := make(map[uint64]int64)
		var nRefused, nDeny, nLease int64
		i := g
		for pb.Next() {
			k := z.Uint64()
			inst := i % instances
			i++
			if !seen[inst*zipfKeys+k].Load() && seen[inst*zipfKeys+k].CompareAndSwap(false, true) {
				first.Add(1)
			}
			d, err := tiers[inst].Take(ctx, keys[k], 1)
			if err != nil {
				if failures.Add(1) == 1 {
					b.Errorf("decision failed: %v", err)
				}
				continue
			}
			switch d.Source {
			case SourceLease:
				nLease++
			case SourceDenyCache:
				nDeny++
			}
			if !d.Allowed {
				nRefused++
				continue
			}
			mine[k|windowEnding(d)<<20]++
		}
		mu.Lock()
		defer mu.Unlock()
		for k, n := range mine {
			admitted[k] += n
		}
		refused += nRefused
		fromDeny += nDeny
		fromLease += nLease
	})
	b.StopTimer()

	// Give back what the leases hold: that costs script calls too.
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, tier := range tiers {
		if err := tier.Close(closeCtx); err != nil {
			b.Fatal(err)
		}
	}
	if n := failures.Load(); n > 0 {
		b.Fatalf("%d of %d decisions failed", n, b.N)
	}
	for k, n := range admitted {
		if n > limit {
			b.Fatalf("key %s admitted %d times in the window ending at %v, limit %d",
				keys[k&(1<<20-1)], n, time.Unix(int64(k>>20)*3600, 0).UTC(), limit)
		}
	}
	scripts, err := scriptCalls(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	b.ReportMetric(float64(scripts)/n, "scripts/decision")
	b.ReportMetric(float64(refused)/n, "refused/decision")
	b.ReportMetric((n-float64(fromDeny+fromLease))/n, "store/decision")
	b.ReportMetric(float64(first.Load())/n, "first/decision")
	b.ReportMetric(float64(limit), "limit/key")
}

// windowEnding names the hour-long window a fixed-window decision fell in
// by the hour its ResetAfter ends at, rounded to the nearest hour, so
// the milliseconds between Redis deciding and this clock reading cannot
// move it to a neighbouring window.
func windowEnding(d Decision) uint64 {
	end := time.Now().Add(d.ResetAfter).Add(30 * time.Minute)
	return uint64(end.Unix() / 3600)
}

// zipfLimit is the smallest per-key limit at which, of n decisions on
// keys drawn as the benchmark draws them, the expected share refused is
// at most share: Σ max(0, n·p_k − L) ≤ share·n.
func zipfLimit(n int, share float64) int64 {
	weights := make([]float64, zipfKeys)
	var sum float64
	for k := range weights {
		weights[k] = math.Pow(zipfV+float64(k), -zipfS)
		sum += weights[k]
	}
	over := func(limit int64) float64 {
		var refused float64
		for _, w := range weights {
			refused += max(0, float64(n)*w/sum-float64(limit))
		}
		return refused
	}
	lo, hi := int64(1), max(int64(1), int64(n))
	for lo < hi {
		mid := lo + (hi-lo)/2
		if over(mid) <= share*float64(n) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// scriptCalls is how many script calls Redis has run since its statistics
// were last reset: EVAL, EVALSHA and their read-only forms.
func scriptCalls(ctx context.Context, c redis.UniversalClient) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var calls int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, stats, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro":
		default:
			continue
		}
		for _, field := range strings.Split(stats, ",") {
			if v, found := strings.CutPrefix(field, "calls="); found {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				calls += n
			}
		}
	}
	return calls, sc.Err()
}

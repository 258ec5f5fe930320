package regional_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
)

// figuresEnv runs TestRegionFigures: it takes some seconds and measures
// latency, which a busy machine (CI) skews, so it runs on demand.
const figuresEnv = "FLOODGATE_REGION_FIGURES"

// figureAlgorithms are the algorithms a global block applies to.
var figureAlgorithms = []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowLog, limiter.SlidingWindowCounter, limiter.TokenBucket}

// TestRegionFigures prints the figures of docs/regions.md and
// BENCHMARKS.md for regions: one global redis-server 30 ms away each way
// (internal/delayproxy), two regional ones, four instances (regional
// stores, two per region, region_quota 0.3):
//
//   - exactness: per algorithm, 600 requests for a limit of 100 spread
//     over the four instances admit at most 100; 60 requests of another
//     key, then, once the regions' idle units are back in global (timed),
//     300 more: exactly 100 in all;
//   - latency: median and p99 of decisions that do not refill the region,
//     against a zone on the regional Redis alone (same machine, no
//     global), and global script calls per decision;
//   - returns: how long the units the regions hold take to come back to
//     global once idle, and what region 0 alone is refused meanwhile (the
//     under-admission of docs/regions.md).
//
// Run with FLOODGATE_REGION_FIGURES=1 go test -count=1 -v -run
// TestRegionFigures ./limiter/regional, on a quiet machine.
func TestRegionFigures(t *testing.T) {
	if os.Getenv(figuresEnv) != "1" {
		t.Skipf("set %s=1 to measure the regions' figures", figuresEnv)
	}
	storetest.AwayFromHourEnd()
	h := startRegions(t)
	var out strings.Builder
	fmt.Fprintf(&out, "regions: global %v away each way, 2 regions × 2 instances, region_quota %v, limit 100/h\n", globalDelay, figureQuota)
	out.WriteString("exactness (requests spread over the four instances, eight at a time each):\n")
	for _, alg := range figureAlgorithms {
		figureExact(t, h, &out, alg)
	}
	out.WriteString("decision latency, one instance, 2000 decisions of cost 1 (limit 100000/h, region_quota 0.5):\n")
	for _, alg := range figureAlgorithms {
		figureLatency(t, h, &out, alg)
	}
	out.WriteString("idle units returning (64 requests over four instances, then region 0 alone):\n")
	for _, alg := range figureAlgorithms {
		figureReturn(t, h, &out, alg)
	}
	t.Log("\n" + out.String())
}

// figureQuota is the regions' region_quota in the exactness and return
// figures: up to 30 of the 100 units in one region.
const figureQuota = 0.3

// fourInstances are zone's four instances, two per region.
func (h *regionsHarness) fourInstances(t *testing.T, zone string, p limiter.Policy, quota float64) []*regional.Store {
	t.Helper()
	var stores []*regional.Store
	for r := range 2 {
		for range 2 {
			s := h.instance(t, r, zone, p, quota)
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			stores = append(stores, s)
		}
	}
	return stores
}

// globalPeek is zone's store on the global server, reached directly
// (no delay): to watch its count.
func (h *regionsHarness) globalPeek(t *testing.T, zone string, p limiter.Policy) limiter.Store {
	t.Helper()
	s, err := redisstore.New(h.globalClient, p, redisstore.Options{Zone: zone, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// untilGlobalHas polls global's remaining for key until it is at least
// want, and reports how long that took (false: not within 5 s).
func untilGlobalHas(t *testing.T, g limiter.Store, key string, want int64) (time.Duration, int64, bool) {
	t.Helper()
	start := time.Now()
	var last int64
	for time.Since(start) < 5*time.Second {
		d, err := g.Peek(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if last = d.Remaining; last >= want {
			return time.Since(start), last, true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start), last, false
}

// figureExact: 600 requests over the four instances admit at most 100;
// on another key, 60 requests leave units in the regions' pools, which
// go back to global once idle (timed), and 300 more then bring the key
// to exactly 100.
func figureExact(t *testing.T, h *regionsHarness, out *strings.Builder, alg limiter.Algorithm) {
	p := limiter.Policy{Algorithm: alg, Events: 100, Window: time.Hour}
	zone := "fig-exact-" + string(alg)
	stores := h.fourInstances(t, zone, p, figureQuota)
	g := h.globalPeek(t, zone, p)
	flood := burst(t, stores, "k", 600)
	if flood > 100 {
		t.Errorf("%s: 600 requests admitted %d, limit 100", alg, flood)
	}
	first := burst(t, stores, "k2", 60)
	idle := time.Now()
	_, left, ok := untilGlobalHas(t, g, "k2", 100-first)
	ret := time.Since(idle)
	second := burst(t, stores, "k2", 300)
	total := first + second
	verdict := "exact"
	switch {
	case total > 100+1: // a token bucket refills one unit in 36 s
		verdict = "OVER THE LIMIT"
		t.Errorf("%s: %d then %d admitted, limit 100", alg, first, second)
	case total < 100:
		verdict = "UNDER"
		t.Errorf("%s: %d then %d admitted, want 100 in all", alg, first, second)
	}
	returned := fmt.Sprintf("idle units back in global %v after the last request", ret.Round(time.Millisecond))
	if !ok {
		returned = fmt.Sprintf("idle units NOT back in global after %v (global has %d, want %d)", ret.Round(time.Millisecond), left, 100-first)
	}
	fmt.Fprintf(out, "  %-22s 600 requests: %3d admitted; 60 requests: %d admitted, %s, then 300 more: %d admitted; %d in all (%s)\n", alg, flood, first, returned, second, total, verdict)
}

// figureLatency times n decisions of one instance of a regional zone and
// of a zone on the regional Redis alone, sequentially.
func figureLatency(t *testing.T, h *regionsHarness, out *strings.Builder, alg limiter.Algorithm) {
	const n = 2000
	ctx := context.Background()
	p := limiter.Policy{Algorithm: alg, Events: 100_000, Window: time.Hour}
	zone := "fig-latency-" + string(alg)
	s := h.instance(t, 0, zone, p, 0.5)
	defer func() { _ = s.Close(ctx) }()
	alone, err := redisstore.New(newClient(t, h.regions[0].Addr()), p, redisstore.Options{Zone: zone + "-alone", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pooled, refills, calls := h.timeTakes(t, string(alg), s, n)
	var direct []time.Duration
	for range n {
		t0 := time.Now()
		if a, err := alone.Take(ctx, "k", 1); err != nil || !a.Allowed {
			t.Fatalf("%s: take on the regional Redis alone: %+v %v", alg, a, err)
		}
		direct = append(direct, time.Since(t0))
	}
	fmt.Fprintf(out, "  %-22s from the pool: median %v p99 %v (%d decisions); regional Redis alone: median %v p99 %v; %d refills (median %v); %d global script calls, %.4f per decision\n",
		alg, quantile(pooled, 0.5), quantile(pooled, 0.99), len(pooled), quantile(direct, 0.5), quantile(direct, 0.99),
		len(refills), quantile(refills, 0.5), calls, float64(calls)/n)
}

// quantile is the q-quantile of ds (nearest rank), rounded to µs.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, int(float64(len(s))*q))
	return s[i].Round(time.Microsecond)
}

// figureReturn: 64 requests over the four instances leave units in both
// regions; region 0 alone is then refused what region 1 holds (the
// under-admission), until region 1's idle units are back in global.
func figureReturn(t *testing.T, h *regionsHarness, out *strings.Builder, alg limiter.Algorithm) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: alg, Events: 100, Window: time.Hour}
	zone := "fig-return-" + string(alg)
	stores := h.fourInstances(t, zone, p, figureQuota)
	g := h.globalPeek(t, zone, p)
	if got := burst(t, stores, "k", 64); got != 64 {
		t.Fatalf("%s: 64 requests admitted %d, want all", alg, got)
	}
	idle := time.Now() // region 1's last request
	var held [2]int64
	for r := range 2 {
		in, err := stores[2*r].Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		held[r] = in.Units
	}
	gd, err := g.Peek(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	alone := burst(t, stores[:2], "k", 304)
	_, left, ok := untilGlobalHas(t, g, "k", 100-64-alone)
	ret := time.Since(idle)
	later := burst(t, stores[:2], "k", 304)
	total := 64 + alone + later
	if total < 100 || total > 101 {
		t.Errorf("%s: 64, then %d in region 0 alone, then %d: %d in all, want 100", alg, alone, later, total)
	}
	returned := fmt.Sprintf("every idle unit back in global %v after region 1's last request (global then had %d)", ret.Round(time.Millisecond), left)
	if !ok {
		returned = fmt.Sprintf("idle units NOT back in global after %v (global has %d, want %d)", ret.Round(time.Millisecond), left, 100-64-alone)
	}
	fmt.Fprintf(out, "  %-22s after 64: global %d left, region 0 holds %d, region 1 holds %d; region 0 alone then admitted %d of the %d left (under-admission %d); %s; region 0 then admitted %d more: %d in all\n",
		alg, gd.Remaining, held[0], held[1], alone, 36, 36-alone, returned, later, total)
}

package nearcache

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/delayproxy"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// The figures of issue 32, for BENCHMARKS.md: they take seconds of real
// time each, so they run only with FLOODGATE_LEASE_FIGURES=1:
//
//	FLOODGATE_LEASE_FIGURES=1 go test -count=1 -v -run 'TestLeaseFigures' ./limiter/nearcache/

// figures skips t unless FLOODGATE_LEASE_FIGURES is 1.
func figures(t *testing.T) {
	t.Helper()
	if os.Getenv("FLOODGATE_LEASE_FIGURES") != "1" {
		t.Skip("set FLOODGATE_LEASE_FIGURES=1 to measure")
	}
}

// TestLeaseFiguresDistantRedis: one instance with a 20 ms delay each way
// to Redis (internal/delayproxy, a 40 ms round trip), one key at a steady
// 200 requests a second for 5 s, each request sent on its schedule
// whatever the others wait for. A fixed window of 1,000,000 an hour with
// local_quota 0.1: the key is never refused, so every wait is a lease's.
// It prints the decision latency's p50, p99 and maximum after the first
// second, and how many requests waited about a round trip (20 ms or
// more) then and in the first second.
func TestLeaseFiguresDistantRedis(t *testing.T) {
	figures(t)
	const (
		delay    = 20 * time.Millisecond
		rate     = 200
		duration = 5 * time.Second
		warmup   = time.Second
	)
	srv := redistest.Start(t)
	proxy, err := delayproxy.Start(srv.Addr(), delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	client := instanceClientsOf(t, redisstore.Config{Addresses: []string{proxy.Addr()}}, 1)[0]
	t.Cleanup(func() { _ = client.Close() })
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1_000_000, Window: time.Hour}
	store := newTestRedis(t, client, p, redisstore.Options{Zone: "figures", Timeout: time.Second})
	ctx := context.Background()
	if err := store.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	cache, err := New(store, p, Options{LeaseFraction: 0.1, DenyFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Close(ctx) })
	storetest.AwayFromHourEnd()

	type sample struct {
		at, took time.Duration
		source   limiter.Source
	}
	var (
		mu      sync.Mutex
		samples []sample
		wg      sync.WaitGroup
	)
	start := time.Now()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for time.Since(start) < duration {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			d, err := cache.Take(ctx, "steady", 1)
			took := time.Since(sent)
			if err != nil || !d.Allowed {
				t.Errorf("%+v %v", d, err)
				return
			}
			mu.Lock()
			samples = append(samples, sample{sent.Sub(start), took, d.Source})
			mu.Unlock()
		}()
	}
	wg.Wait()
	var after []time.Duration
	var waitedFirst, waitedAfter, fromStore int
	for _, s := range samples {
		waited := s.took >= delay
		if s.at < warmup {
			if waited {
				waitedFirst++
			}
			continue
		}
		after = append(after, s.took)
		if waited {
			waitedAfter++
		}
		if s.source == limiter.SourceStore {
			fromStore++
		}
	}
	slices.Sort(after)
	pct := func(q float64) time.Duration { return after[min(len(after)-1, int(q*float64(len(after))))] }
	t.Logf("%d requests at %d/s for %v, %v to Redis each way; after the first second: %d requests, p50 %v, p99 %v, max %v; waited %v or more: %d (and %d in the first second); asked Redis themselves: %d",
		len(samples), rate, duration, delay, len(after), pct(0.5), pct(0.99), after[len(after)-1], delay, waitedAfter, waitedFirst, fromStore)
}

// TestLeaseFiguresBurstAcrossInstances: issue 32's burst. Three instances
// (Caches on clients of their own) on one local Redis, a fixed window of
// 30 an hour with local_quota 0.3 (leases of up to 9), the denial cache
// at its default 1 s, and instances asking each other for a refused key's
// leases (Options.Reclaim over redisstore.Reclaims, as the handler wires
// them): 8 requests on one instance, then 40 on another 20 ms apart. It
// prints how many were admitted and when the 30th was, counted from the
// first request of the 40. Never more than 30: it fails if more.
func TestLeaseFiguresBurstAcrossInstances(t *testing.T) {
	figures(t)
	srv := redistest.Start(t)
	clients := instanceClients(t, []string{srv.Addr()}, 3)
	t.Cleanup(func() { _ = storetest.CloseClients(clients) })
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 30, Window: time.Hour}
	storetest.AwayFromHourEnd()
	caches := reclaimingCaches(t, clients, p, "figures-burst", 0.3)
	admitted, last := burstAcrossInstances(t, caches, "burst", 40, 20*time.Millisecond)
	if admitted > 30 {
		t.Fatalf("admitted %d, more than the limit of 30", admitted)
	}
	t.Logf("8 requests on instance 0, then 40 on instance 1 20 ms apart: %d admitted, the last of them %v after the 40 began", admitted, last.Round(time.Millisecond))
}

package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

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

package nearcache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// reclaimingCaches puts, on each client, a Redis store for zone behind a
// Cache with leases of up to fraction of the quota and a 1 s denial
// cache, each instance asking the others for a key's leases when Redis
// refuses it one and answering their requests, as the instances of one
// zone do; it waits until every instance listens.
func reclaimingCaches(tb testing.TB, clients []redis.UniversalClient, p limiter.Policy, zone string, fraction float64) []*Cache {
	tb.Helper()
	caches := make([]*Cache, len(clients))
	for i, client := range clients {
		store := newTestRedis(tb, client, p, redisstore.Options{Zone: zone, Timeout: 5 * time.Second})
		rec, err := redisstore.NewReclaims(client, redisstore.ReclaimsOptions{OnError: func(err error) { tb.Logf("instance %d: %v", i, err) }})
		if err != nil {
			tb.Fatal(err)
		}
		var cache *Cache
		listener := rec.Listen(zone, func(name string) {
			go func() { _ = cache.ReturnNamed(context.Background(), name) }()
		})
		cache, err = New(store, p, Options{LeaseFraction: fraction, DenyFor: time.Second,
			Reclaim: listener.Ask, Name: store.Key})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			listener.Stop()
			_ = cache.Close(context.Background())
			_ = rec.Close()
		})
		caches[i] = cache
		testutil.Eventually(tb, "instance "+fmt.Sprint(i)+" to listen for reclaims", func() error {
			if !rec.Listening(zone) {
				return fmt.Errorf("not subscribed to %s's reclaims", zone)
			}
			return nil
		})
	}
	return caches
}

// burstAcrossInstances is issue 32's burst: 8 requests of one key on
// instance 0, then up to n on instance 1, gap apart. It returns how many
// were admitted in all and when the last admitted one was, counted from
// the first request on instance 1.
func burstAcrossInstances(tb testing.TB, caches []*Cache, key string, n int, gap time.Duration) (admitted int, last time.Duration) {
	tb.Helper()
	ctx := context.Background()
	for range 8 {
		if d, err := caches[0].Take(ctx, key, 1); err != nil || !d.Allowed {
			tb.Fatalf("instance 0: %+v %v", d, err)
		}
		admitted++
	}
	start := time.Now()
	for i := range n {
		d, err := caches[1].Take(ctx, key, 1)
		if err != nil {
			tb.Fatal(err)
		}
		if d.Allowed {
			admitted++
			last = time.Since(start)
		}
		if i < n-1 {
			time.Sleep(gap)
		}
	}
	return admitted, last
}

// TestReclaimReachesTheLimit: a burst spread over instances reaches the
// whole limit at once, rather than a second later when the leases other
// instances hold lapse: three instances, 30 an hour, leases of up to 9;
// after 8 requests on one, the other is refused while the first holds
// units, asks for them, and is admitted them within the reclaim's
// round trips, and never more than 30 in all.
func TestReclaimReachesTheLimit(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 30, Window: time.Hour}
	onInstanceRedises(t, 3, func(t *testing.T, clients []redis.UniversalClient) {
		caches := reclaimingCaches(t, clients, p, "reclaim", 0.3)
		admitted, last := burstAcrossInstances(t, caches, "k", 40, 10*time.Millisecond)
		if admitted != 30 {
			t.Fatalf("admitted %d, want the limit's 30", admitted)
		}
		// 40 requests 10 ms apart: the last admitted well before a lease
		// of instance 0 could lapse (a second after its grant).
		if last > 700*time.Millisecond {
			t.Fatalf("the 30th admitted %v after the burst began: not by a reclaim", last)
		}
		if held := caches[0].held(); held != 0 {
			t.Fatalf("instance 0 still holds %d units", held)
		}
		// Nothing more, on any instance.
		for i, cache := range caches {
			if d, err := cache.Take(context.Background(), "k", 1); err != nil || d.Allowed {
				t.Fatalf("instance %d past the limit: %+v %v", i, d, err)
			}
		}
	})
}

package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// newTestRedis opens a Redis store and fails t on error.
func newTestRedis(t testing.TB, client redis.UniversalClient, p limiter.Policy, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	r, err := redisstore.New(client, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newTestMemory opens a memory store on clock (nil: the wall clock) and
// fails t on error.
func newTestMemory(t testing.TB, p limiter.Policy, clock limiter.Clock) *limiter.Memory {
	t.Helper()
	m, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// openCache puts a Cache in front of store, fails t on error, and closes
// the cache when t ends.
func openCache(t testing.TB, store limiter.Leaser, p limiter.Policy, opts Options) *Cache {
	t.Helper()
	cache, err := New(store, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Close(context.Background()) })
	return cache
}

// withUnspentLeases opens a memory store of 100 tokens an hour behind a
// cache that leases half of what is left, and takes 1 unit twice for each
// key: a lease of 1, then of 2, so the store counts 3 taken for the key
// and the cache holds 1 of them leased and unspent.
func withUnspentLeases(t *testing.T, keys ...string) (*limiter.Memory, *Cache) {
	t.Helper()
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour}
	store := newTestMemory(t, p, nil)
	cache := openCache(t, store, p, Options{LeaseFraction: 0.5})
	for _, k := range keys {
		for range 2 {
			if d, err := cache.Take(context.Background(), k, 1); err != nil || !d.Allowed {
				t.Fatalf("take %s: %+v %v", k, d, err)
			}
		}
	}
	return store, cache
}

// takeResult is the answer of a take made by takeAsync.
type takeResult struct {
	d   limiter.Admission
	err error
}

// takeAsync takes cost units of key through cache in a goroutine.
func takeAsync(ctx context.Context, cache *Cache, key string, cost int64) chan takeResult {
	done := make(chan takeResult, 1)
	go func() {
		d, err := cache.Take(ctx, key, cost)
		done <- takeResult{d, err}
	}()
	return done
}

// ceilDiv is ⌈a/b⌉ for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

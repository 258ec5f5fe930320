package nearcache

import (
	"context"
	"testing"

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

// ceilDiv is ⌈a/b⌉ for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

package nearcache

import (
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

// ceilDiv is ⌈a/b⌉ for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

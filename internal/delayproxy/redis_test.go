package delayproxy

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisThroughProxy: a go-redis client speaks to a real redis-server
// through the proxy, as the near cache's latency tests do, and each
// command pays the round trip.
func TestRedisThroughProxy(t *testing.T) {
	const delay = 10 * time.Millisecond
	srv := redistest.Start(t)
	p := startProxy(t, srv.Addr(), delay)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET through the proxy: %q %v", got, err)
	}
	if rtt := time.Since(start); rtt < 2*delay {
		t.Fatalf("GET took %s, want at least the round trip %s", rtt, 2*delay)
	}
}

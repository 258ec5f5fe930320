package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// BenchmarkNearCacheLease is the path of a hot key's request spent from
// its lease in memory, what a leased Redis zone costs per request between
// round trips (here over a memory store standing in for Redis).
func BenchmarkNearCacheLease(b *testing.B) {
	ctx := context.Background()
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow} {
		b.Run(string(alg), func(b *testing.B) {
			// A limit no benchmark run reaches: every take is admitted.
			p := limiter.Policy{Algorithm: alg, Events: 1 << 32, Window: time.Second}
			cache := openCache(b, newTestMemory(b, p, nil), p, Options{LeaseFraction: 0.1})
			for b.Loop() {
				if d, err := cache.Take(ctx, "hot", 1); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}

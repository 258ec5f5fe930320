package limiter

import (
	"context"
	"testing"
	"time"
)

// BenchmarkNearCacheLease is the path of a hot key's request spent from
// its lease in memory, what a leased Redis zone costs per request between
// round trips (here over a memory store standing in for Redis).
func BenchmarkNearCacheLease(b *testing.B) {
	ctx := context.Background()
	for _, alg := range []Algorithm{TokenBucket, FixedWindow} {
		b.Run(string(alg), func(b *testing.B) {
			// A limit no benchmark run reaches: every take is admitted.
			p := Policy{Algorithm: alg, Events: 1 << 32, Window: time.Second}
			store, err := NewMemory(p, MemoryOptions{})
			if err != nil {
				b.Fatal(err)
			}
			cache, err := NewNearCache(store, p, NearCacheOptions{LeaseFraction: 0.1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = cache.Close(ctx) })
			for b.Loop() {
				if d, err := cache.Take(ctx, "hot", 1); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
		})
	}
}

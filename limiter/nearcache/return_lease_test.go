package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestNearCacheGiveBackKey: ReturnLease returns one key's unspent lease to
// the store at once, and the key's next request is decided afresh.
func TestNearCacheGiveBackKey(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour}
	store := newTestMemory(t, p, nil)
	cache := openCache(t, store, p, Options{LeaseFraction: 0.5})
	ctx := context.Background()
	for range 2 { // a lease of 1, then of 2: one unit leased, unspent
		if d, err := cache.Take(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("take: %+v %v", d, err)
		}
	}
	d, _ := store.Peek(ctx, "k")
	if taken := 100 - d.Remaining; taken <= 2 {
		t.Fatalf("store counts %d taken after 2 requests: want a lease beyond them", taken)
	}
	if err := cache.ReturnLease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, _ := store.Peek(ctx, "k"); d.Remaining != 98 {
		t.Fatalf("after ReturnLease the store has %d remaining, want 98", d.Remaining)
	}
}

package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestNearCacheReturnLeasesWithPrefix: the leases of every key under a
// prefix go back to the store at once, whatever shard holds them, and
// the leases of other keys stay.
func TestNearCacheReturnLeasesWithPrefix(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour}
	store, err := limiter.NewMemory(p, limiter.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := New(store, p, Options{LeaseFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close(context.Background())
	ctx := context.Background()
	keys := []string{"acme:1", "acme:2", "acme:3", "acme:4", "acme", "globex:1"}
	for _, k := range keys {
		for range 2 { // a lease of 1, then of 2: one unit leased, unspent
			if d, err := cache.Take(ctx, k, 1); err != nil || !d.Allowed {
				t.Fatalf("take %s: %+v %v", k, d, err)
			}
		}
	}
	if err := cache.ReturnLeasesWithPrefix(ctx, "acme:"); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		d, _ := store.Peek(ctx, k)
		under := len(k) > 5 && k[:5] == "acme:"
		if got := d.Remaining == 98; got != under {
			t.Errorf("%s: %d remaining in the store after the prefix's return (returned: %v, want %v)", k, d.Remaining, got, under)
		}
	}
}

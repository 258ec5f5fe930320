package nearcache

import (
	"context"
	"testing"
)

// TestNearCacheReturnLeasesWithPrefix: the leases of every key under a
// prefix go back to the store at once, whatever shard holds them, and
// the leases of other keys stay.
func TestNearCacheReturnLeasesWithPrefix(t *testing.T) {
	keys := []string{"acme:1", "acme:2", "acme:3", "acme:4", "acme", "globex:1"}
	store, cache := withUnspentLeases(t, keys...)
	ctx := context.Background()
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

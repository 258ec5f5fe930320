package nearcache

import (
	"context"
	"testing"
)

// TestNearCacheGiveBackKey: ReturnLease returns one key's unspent lease to
// the store at once, and the key's next request is decided afresh.
func TestNearCacheGiveBackKey(t *testing.T) {
	store, cache := withUnspentLeases(t, "k")
	ctx := context.Background()
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

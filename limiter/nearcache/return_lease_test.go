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

// TestNearCacheReturnLeasesWithPrefixRefilledAhead: a prefix's change
// returns every unit its keys hold, in the lease refilled ahead as in the
// current one, and what a refill ahead still under way brings goes back
// when it answers: none is spent under the old limit or stranded until it
// lapses.
func TestNearCacheReturnLeasesWithPrefixRefilledAhead(t *testing.T) {
	for _, underWay := range []bool{false, true} {
		name := map[bool]string{false: "held", true: "under way"}[underWay]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cache, store, held := aheadUnderWay(t, "acme:1", !underWay)
			// toAhead leaves 6 units in the lease of 8 and starts a refill
			// ahead of 16, answered at once unless it is to stay under way.
			want := map[bool]int64{false: 6 + 16, true: 6}[underWay]
			if h := cache.held(); h != want {
				t.Fatalf("the cache holds %d units before the return, want %d", h, want)
			}
			if err := cache.ReturnLeasesWithPrefix(ctx, "acme:"); err != nil {
				t.Fatal(err)
			}
			held.runAll()
			checkAheadReturned(t, cache, store, "acme:1")
		})
	}
}

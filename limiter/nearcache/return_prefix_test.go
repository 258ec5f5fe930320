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
			if h := cache.held(); h != 0 {
				t.Errorf("the cache holds %d units of the prefix's key after its return", h)
			}
			if st, _ := store.Memory.Peek(ctx, "acme:1"); st.Remaining != 1000-9 {
				t.Errorf("the store has %d left, want %d: every unit but the 9 spent back", st.Remaining, 1000-9)
			}
		})
	}
}

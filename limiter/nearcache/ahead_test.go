package nearcache

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// heldAheads is an Options.goAhead that keeps each refill ahead until the
// test runs it, or once inline is set runs it at once.
type heldAheads struct {
	runs   []func()
	inline bool
}

func (h *heldAheads) hook(_ string, run func()) {
	if h.inline {
		run()
		return
	}
	h.runs = append(h.runs, run)
}

// runAll runs the refills ahead held so far, in order.
func (h *heldAheads) runAll() {
	runs := h.runs
	h.runs = nil
	for _, run := range runs {
		run()
	}
}

// aheadPolicy is the policy of the refill-ahead tests: a fixed window of
// 1000 an hour, leases of up to 50.
var aheadPolicy = limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1000, Window: time.Hour}

// toAhead takes 9 units of key one at a time, the clock standing still:
// leases of 1, 2, 4 and 8 (the fourth in a row), and the ninth take,
// spending the lease of 8 at a rate that runs it out at once, starts a
// refill ahead of 16. The lease of 8 then holds 6 units.
func toAhead(t *testing.T, cache *Cache, key string) {
	t.Helper()
	for range 9 {
		storetest.MustAdmit(t, cache, key)
	}
}

// aheadUnderWay is a cache over aheadPolicy whose refills ahead wait in
// held (or, inline, run at once), with key brought to one (toAhead), on a
// clock that stands still.
func aheadUnderWay(t *testing.T, key string, inline bool) (*Cache, *countingLeaser, *heldAheads) {
	t.Helper()
	held := &heldAheads{inline: inline}
	cache, store := newTestCache(t, aheadPolicy, testutil.NewClock(time.Unix(1_800_000_000, 0)), Options{LeaseFraction: 0.05, goAhead: held.hook})
	toAhead(t, cache, key)
	return cache, store, held
}

// checkAheadReturned fails t unless, once key's leases were returned
// after aheadUnderWay and its held refills ran, the cache holds nothing
// and the store has every unit back but the 9 spent: none is spent under
// the old limit or stranded until it lapses.
func checkAheadReturned(t *testing.T, cache *Cache, store *countingLeaser, key string) {
	t.Helper()
	if h := cache.held(); h != 0 {
		t.Errorf("the cache holds %d units of %s after its leases were returned", h, key)
	}
	if st, _ := store.Memory.Peek(context.Background(), key); st.Remaining != 1000-9 {
		t.Errorf("the store has %d left, want %d: every unit but the 9 spent back", st.Remaining, 1000-9)
	}
}

// TestRefillAheadWaitedFor: a request that finds its key's lease spent
// while a refill ahead is under way waits for it, rather than asking the
// store again, and is then paid from the lease it brought.
func TestRefillAheadWaitedFor(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	held := &heldAheads{}
	waiting := make(chan string, 1)
	cache, store := newTestCache(t, aheadPolicy, clock, Options{LeaseFraction: 0.05, goAhead: held.hook, waiting: func(key string) { waiting <- key }})
	toAhead(t, cache, "k")
	if len(held.runs) != 1 {
		t.Fatalf("%d refills ahead started, want 1", len(held.runs))
	}
	for range 6 { // the lease's last 6 units
		if d := storetest.MustAdmit(t, cache, "k"); d.Source != limiter.SourceLease {
			t.Fatalf("source %v, want the lease", d.Source)
		}
	}
	done := takeAsync(ctx, cache, "k", 1)
	select {
	case <-waiting:
	case r := <-done:
		t.Fatalf("the request did not wait for the refill ahead: %+v, %v", r.d, r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the request neither waited nor was answered")
	}
	held.runAll()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	d := r.d
	_, next, _ := cache.lease("k")
	if !d.Allowed || d.Source != limiter.SourceLease || d.Receipt.Lease != next {
		t.Fatalf("%+v: want paid from the lease refilled ahead (%d)", d, next)
	}
	if sizes := store.leaseSizes(); !slices.Equal(sizes, []int64{1, 2, 4, 8, 16}) {
		t.Fatalf("lease sizes %v, want 1, 2, 4, 8 and 16 ahead: the waiting request asked nothing", sizes)
	}
}

// TestRefillAheadGivesBackWhatTheLeaseLeft: when the lease refilled ahead
// takes over from one that cannot pay a request, what the old one holds
// goes back to the old one's own grant, at once, and nothing is counted
// twice.
func TestRefillAheadGivesBackWhatTheLeaseLeft(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	p := limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 1000, Window: time.Minute}
	cache, store := newTestCache(t, p, clock, Options{LeaseFraction: 0.05})
	var grants []limiter.Receipt
	for range 9 { // as toAhead, the refill ahead answered at once
		a := storetest.MustAdmit(t, cache, "k")
		grants = append(grants, a.Receipt)
	}
	// The lease of 8 holds 6 units: a request of 7 promotes the lease of
	// 16 refilled ahead, and the 6 go back to the grant of 8.
	d, err := cache.Take(ctx, "k", 7)
	if err != nil || !d.Allowed || d.Source != limiter.SourceLease {
		t.Fatalf("take of 7: %+v, %v; want paid from the lease refilled ahead", d, err)
	}
	store.mu.Lock()
	returns := slices.Clone(store.returns)
	store.mu.Unlock()
	if len(returns) != 1 || returns[0].Units != 6 || returns[0].Taken.Name() != grants[8].Mark {
		t.Fatalf("returns %+v, want the 6 units back to the lease of 8's log entry (%d)", returns, grants[8].Mark)
	}
	// 1 + 2 + 4 + 8 + 16 taken, 6 back, 9 + 7 spent (and any lease
	// refilled ahead since held): every unit taken is spent, held, or
	// back.
	var taken int64
	for _, n := range store.leaseSizes() {
		taken += n
	}
	if held := cache.held(); taken-6-held != 16 {
		t.Fatalf("%d units taken, 6 given back, %d held: %d spent, want 16", taken, held, taken-6-held)
	}
	if st, _ := store.Memory.Peek(ctx, "k"); st.Remaining != 1000-(taken-6) {
		t.Fatalf("the store has %d left, want %d", st.Remaining, 1000-(taken-6))
	}
}

// TestRefillAheadFails: a refill ahead that fails leaves the key deciding
// on the lease it holds, then asking the store as any refill does.
func TestRefillAheadFails(t *testing.T) {
	ctx := context.Background()
	cache, store, held := aheadUnderWay(t, "k", false)
	store.failLeases.Store(true)
	held.runAll()
	for range 6 {
		if d := storetest.MustAdmit(t, cache, "k"); d.Source != limiter.SourceLease {
			t.Fatalf("source %v, want the lease still held", d.Source)
		}
	}
	if _, err := cache.Take(ctx, "k", 1); err == nil {
		t.Fatal("the lease is spent and the store is down: want its error")
	}
	store.failLeases.Store(false)
	if d := storetest.MustAdmit(t, cache, "k"); d.Source != limiter.SourceStore {
		t.Fatalf("source %v, want the store once it is back", d.Source)
	}
}

// TestRefillAheadAfterReturnLease: units a refill ahead brings after the
// key's leases were returned (its override changed, or another instance
// asked for them) go back at once, never spent under the old limit.
func TestRefillAheadAfterReturnLease(t *testing.T) {
	ctx := context.Background()
	cache, store, held := aheadUnderWay(t, "k", false)
	if err := cache.ReturnLease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	held.runAll()
	checkAheadReturned(t, cache, store, "k")
}

// TestRefillAheadAfterClose: Close waits for a refill ahead under way,
// whose units then go back.
func TestRefillAheadAfterClose(t *testing.T) {
	ctx := context.Background()
	cache, store, held := aheadUnderWay(t, "k", false)
	closed := make(chan error, 1)
	go func() { closed <- cache.Close(ctx) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a refill ahead under way", err)
	case <-time.After(50 * time.Millisecond):
	}
	held.runAll()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Memory.Peek(ctx, "k"); st.Remaining != 1000-9 {
		t.Fatalf("the store has %d left after Close, want %d", st.Remaining, 1000-9)
	}
}

// TestRefillAheadAfterReset: a refill ahead of a key an admin reset forgot
// before it was sent asks nothing.
func TestRefillAheadAfterReset(t *testing.T) {
	ctx := context.Background()
	cache, store, held := aheadUnderWay(t, "k", false)
	if _, err := cache.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	held.runAll()
	held.inline = true
	if sizes := store.leaseSizes(); !slices.Equal(sizes, []int64{1, 2, 4, 8}) {
		t.Fatalf("lease sizes %v, want 1, 2, 4 and 8: the refill ahead of the forgotten key asked nothing", sizes)
	}
	if got := admitAll(t, cache, "k", 1000); got != 1000 {
		t.Fatalf("admitted %d after the reset, want the fresh window's 1000", got)
	}
}

package regional

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// drainRegion is one region over a MemoryPool and a global Memory on one
// injected clock, its stores swept by hand.
type drainRegion struct {
	t      *testing.T
	p      limiter.Policy
	clock  *testutil.Clock
	global *limiter.Memory
	pool   *MemoryPool
}

func newDrainRegion(t *testing.T, p limiter.Policy) *drainRegion {
	t.Helper()
	global, clock := storetest.NewMemory(t, p, limiter.MemoryOptions{})
	return &drainRegion{t: t, p: p, clock: clock, global: global, pool: NewMemoryPool(clock)}
}

// store is one instance of the region, on clock (nil: the region's).
func (r *drainRegion) store(pool Pool, clock limiter.Clock) *Store {
	r.t.Helper()
	if clock == nil {
		clock = r.clock
	}
	s, err := New(r.global, pool, r.p, Options{RegionQuota: 1, Clock: clock, manualSweep: true, syncReturns: true})
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// remaining is what global has left of key.
func (r *drainRegion) remaining(key string) int64 {
	r.t.Helper()
	d, err := r.global.Peek(context.Background(), key)
	if err != nil {
		r.t.Fatal(err)
	}
	return d.Remaining
}

// TestGiveBackAfterItsBatchWasDrained: instance A installs a batch and B
// spends a unit from it; A closes (a reload's Cleanup), which drains A's
// batches and stops tracking them; then B's request is not counted and
// gives its unit back. The unit must reach global: before the drain ended
// the batch, it went back into it, where no janitor would ever return it
// (the handler model's seed 7292731226277955839: a unit under-admitted
// per give-back for the rest of the window).
func TestGiveBackAfterItsBatchWasDrained(t *testing.T) {
	ctx := context.Background()
	r := newDrainRegion(t, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour})
	a, b := r.store(r.pool, nil), r.store(r.pool, nil)
	storetest.MustAdmit(t, a, "k") // a batch of 1
	storetest.MustAdmit(t, a, "k") // spent within its lifetime: a batch of 2, 1 to spare
	spare := storetest.MustAdmit(t, b, "k")
	if got := r.remaining("k"); got != 7 {
		t.Fatalf("global has %d left, want 7: batches of 1 and 2, B spending A's spare unit", got)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := spare.GiveBack(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// B's own janitor, and its Close, return only what B installed.
	r.clock.Advance(Lifetime + time.Millisecond)
	b.sweep(ctx, false)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.remaining("k"); got != 8 {
		t.Errorf("global has %d left once the unit given back after A's Close should be back, want 8 (A's two admissions)", got)
	}
	if ps, _ := r.pool.Peek(ctx, "k"); ps.Batch.Units != 0 {
		t.Errorf("the pool still holds %d units of A's drained batch", ps.Batch.Units)
	}
}

// TestEmptyBatchTrackedUntilThePoolSaysItLapsed: an instance's clock
// steps forward (NTP), so its janitor sweeps an empty batch the region's
// pool still holds live. The drain must wait for the pool's lapse: had it
// let go of the batch then, a unit given back into it while it still
// lived on the pool's clock would stay there, and no janitor would return
// it.
func TestEmptyBatchTrackedUntilThePoolSaysItLapsed(t *testing.T) {
	ctx := context.Background()
	r := newDrainRegion(t, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour})
	own := testutil.NewClock(r.clock.Now())
	a := r.store(r.pool, own)
	storetest.MustAdmit(t, a, "k")
	storetest.MustAdmit(t, a, "k")         // a batch of 2, 1 to spare
	last := storetest.MustAdmit(t, a, "k") // the spare: the batch is empty
	r.clock.Advance(Lifetime - 50*time.Millisecond)
	own.Advance(Lifetime + 50*time.Millisecond)
	a.sweep(ctx, false) // lapsed on A's clock, 50ms to go on the pool's
	if _, err := last.GiveBack(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ps, _ := r.pool.Peek(ctx, "k"); ps.Batch.Units != 1 {
		t.Fatalf("the batch holds %d units after the give-back, want 1 (it still lives on the pool's clock)", ps.Batch.Units)
	}
	r.clock.Advance(100 * time.Millisecond)
	own.Advance(100 * time.Millisecond)
	a.sweep(ctx, false)
	if got := r.remaining("k"); got != 8 {
		t.Errorf("global has %d left after the janitor's sweep of the lapsed batch, want 8: the unit given back into it was not returned", got)
	}
}

// TestLateRestOfATokenBucketBatch: the rest of a batch whose installer
// never returned it (it died, or closed after installing it) is found by
// the next refill long after its grant. A token bucket credits a return
// whenever it comes, and it had refilled those tokens meanwhile: returned
// whole, they would pass on top of a full bucket. Another region takes
// the full bucket; the refill that finds the old rest must then be
// refused, not admitted from tokens the bucket had already refilled.
func TestLateRestOfATokenBucketBatch(t *testing.T) {
	ctx := context.Background()
	r := newDrainRegion(t, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: 10 * time.Second})
	a, b := r.store(r.pool, nil), r.store(r.pool, nil)
	other := r.store(NewMemoryPool(r.clock), nil)
	for range 4 {
		storetest.MustAdmit(t, a, "k") // batches of 1, 2 and 4: 3 to spare
	}
	if ps, _ := r.pool.Peek(ctx, "k"); ps.Batch.Units != 3 {
		t.Fatalf("A's batch holds %d units, want 3", ps.Batch.Units)
	}
	// A never sweeps. Nine seconds on, the bucket is full again.
	r.clock.Advance(9 * time.Second)
	if got := r.remaining("k"); got != 10 {
		t.Fatalf("the bucket holds %d, want 10 (full)", got)
	}
	all, err := other.TakeUpTo(ctx, "k", 1, 10)
	if err != nil || !all.Allowed || all.Granted() != 10 {
		t.Fatalf("the other region's lease of the full bucket: %+v, %v", all, err)
	}
	got, err := b.Take(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Allowed {
		t.Errorf("B admitted right after the other region emptied a full bucket (%+v): the 3 units A's batch held 8 s past its lapse went back whole, though the bucket had refilled them", got.Decision)
	}
	if left := r.remaining("k"); left != 0 {
		t.Errorf("the bucket holds %d after the late rest went back, want 0", left)
	}
}

// TestLateRestCredit: what lateRest lets go back of a token bucket's
// batch: all of it up to lateGrace after its lapse, then less a
// unit per unit the bucket refilled (rounded up), never below zero; the
// window counters' whole.
func TestLateRestCredit(t *testing.T) {
	tick := lateGrace.Microseconds()
	for _, c := range []struct {
		alg         limiter.Algorithm
		units, late int64
		want        int64
	}{
		{limiter.TokenBucket, 5, -1000, 5},
		{limiter.TokenBucket, 5, tick, 5},
		{limiter.TokenBucket, 5, tick + 1, 4},         // 1µs of 1/s: rounded up to a unit
		{limiter.TokenBucket, 5, tick + 2_000_000, 3}, // 2 s: 2 units
		{limiter.TokenBucket, 5, tick + 2_000_001, 2}, // a µs more: 3
		{limiter.TokenBucket, 5, tick + 3_600_000_000, 0},
		{limiter.TokenBucket, 5, 1 << 62, 0},
		{limiter.FixedWindow, 5, tick + 3_600_000_000, 5},
	} {
		p := limiter.Policy{Algorithm: c.alg, Events: 10, Window: 10 * time.Second}
		global, err := limiter.NewMemory(p, limiter.MemoryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(global, NewMemoryPool(nil), p, Options{RegionQuota: 1, manualSweep: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.lateRest(c.units, c.late); got != c.want {
			t.Errorf("%s: %d units %dµs after their lapse: %d go back, want %d", c.alg, c.units, c.late, got, c.want)
		}
	}
}

// resetHookGlobal is a global Memory that runs beforeReset (once) when a
// reset reaches it: what other instances do while a reset is under way.
type resetHookGlobal struct {
	*limiter.Memory
	beforeReset func()
}

func (g *resetHookGlobal) Reset(ctx context.Context, key string) (bool, error) {
	if f := g.beforeReset; f != nil {
		g.beforeReset = nil
		f()
	}
	return g.Memory.Reset(ctx, key)
}

// TestResetForgetsABatchGrantedBeforeIt: while instance A's admin reset
// runs, between its reset of the region's pool and global's, instance B
// refills the key from global's state about to be erased. That batch must
// not outlive the reset: a unit of it spent afterwards would pass without
// the fresh state counting it (docs/design.md: "a lease whose grant was
// decided before the reset is never spent after it").
func TestResetForgetsABatchGrantedBeforeIt(t *testing.T) {
	ctx := context.Background()
	r := newDrainRegion(t, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour})
	g := &resetHookGlobal{Memory: r.global}
	open := func() *Store {
		s, err := New(g, r.pool, r.p, Options{RegionQuota: 1, Clock: r.clock, manualSweep: true, syncReturns: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := open(), open()
	g.beforeReset = func() {
		storetest.MustAdmit(t, b, "k")
		storetest.MustAdmit(t, b, "k") // a batch of 2, 1 to spare
	}
	if _, err := a.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if ps, _ := r.pool.Peek(ctx, "k"); ps.Now < ps.Batch.Expires && ps.Batch.Units > 0 {
		t.Errorf("after the reset the pool holds %d units global granted before it", ps.Batch.Units)
	}
	storetest.MustAdmit(t, b, "k")
	if got := r.remaining("k"); got != 9 {
		t.Errorf("global's fresh state has %d left after one admission since the reset, want 9: the admission spent a unit granted before the reset", got)
	}
}

// TestResetDropsGiveBackOfABatchGrantedBeforeIt: a unit spent from a
// batch global granted before an admin reset, given back after it, names
// global's state that granted it (Batch.Epoch), on a clock that stands
// still (every grant under one mark), for every algorithm a region shares:
//   - "global": the reset forgot the batch and the fresh state is spent:
//     the unit goes to global, which drops it (once the region's repeat of
//     global's refusal has passed, the next refill is refused);
//   - "batch": a batch of the fresh state, granted under the same mark,
//     takes it not: the key admits its limit after the reset, not more.
func TestResetDropsGiveBackOfABatchGrantedBeforeIt(t *testing.T) {
	ctx := context.Background()
	for _, alg := range Algorithms() {
		for _, into := range []string{"global", "batch"} {
			t.Run(string(alg)+"/"+into, func(t *testing.T) {
				r := newDrainRegion(t, limiter.Policy{Algorithm: alg, Events: 4, Window: time.Hour})
				s := r.store(r.pool, nil)
				takeAll := func() int64 { return storetest.AdmitAll(t, s, "k", 8) }
				before := storetest.MustAdmit(t, s, "k")
				if _, err := s.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				var n int64
				if into == "batch" {
					storetest.MustAdmit(t, s, "k") // a batch of 4, 3 to spare
					n++
				} else {
					n += takeAll()
					r.clock.Advance(denyFor + time.Millisecond)
				}
				if _, err := before.GiveBack(ctx, 1); err != nil {
					t.Fatal(err)
				}
				if n += takeAll(); n != 4 {
					t.Errorf("admitted %d after the reset, want the limit 4: a unit granted before it came back", n)
				}
			})
		}
	}
}

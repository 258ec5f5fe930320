package limiter

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// countingClock is a hand-set clock that counts its reads.
type countingClock struct {
	testutil.Clock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.Clock.Now()
}

// TestConcurrencyGiveBackReadsNoClock: a concurrency give-back (and a
// Peek, the same call with nothing to give) reads no clock, and what it
// reports is what it reported when it did: the slots left, no times,
// whatever the clock says; a give-back to a state reset since frees
// nothing (the epoch), through a Sharing view too. The algorithms whose
// state moves with time still read the clock on a give-back.
func TestConcurrencyGiveBackReadsNoClock(t *testing.T) {
	ctx := context.Background()
	clock := &countingClock{}
	clock.Set(time.Unix(1_800_000_000, 0))
	p := Policy{Algorithm: Concurrency, Events: 3, Window: time.Minute}
	m, err := NewMemory(p, MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	view, err := m.Sharing(Policy{Algorithm: Concurrency, Events: 5, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Take(ctx, "k", 2)
	if err != nil || !a.Allowed || a.Remaining != 1 {
		t.Fatalf("take: %+v, %v", a, err)
	}
	reads := clock.reads.Load()
	want := Decision{Allowed: true, Remaining: 2}
	for _, step := range []time.Duration{time.Hour, -3 * time.Hour} {
		clock.Advance(step)
		if d, err := m.Peek(ctx, "k"); err != nil || d != (Decision{Allowed: true, Remaining: 1}) {
			t.Fatalf("peek after %v: %+v, %v", step, d, err)
		}
	}
	if d, err := m.GiveBack(ctx, "k", 1, a.Receipt); err != nil || d != want {
		t.Fatalf("give-back: %+v, %v; want %+v", d, err, want)
	}
	if d, err := view.GiveBack(ctx, "k", 1, a.Receipt); err != nil || d != (Decision{Allowed: true, Remaining: 5}) {
		t.Fatalf("give-back through a view of 5: %+v, %v", d, err)
	}
	if n := clock.reads.Load() - reads; n != 0 {
		t.Fatalf("give-backs and peeks read the clock %d times, want none", n)
	}

	// The epoch still decides: a release of a state reset since frees
	// none of the new state's slots.
	old, _ := m.Take(ctx, "k", 2)
	if _, err := m.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if a, _ := m.Take(ctx, "k", 1); !a.Allowed || a.Remaining != 2 {
		t.Fatalf("take after the reset: %+v", a)
	}
	if d, _ := m.GiveBack(ctx, "k", 2, old.Receipt); d != want {
		t.Fatalf("a release of the reset state: %+v; want %+v (nothing freed)", d, want)
	}

	fixed, err := NewMemory(Policy{Algorithm: FixedWindow, Events: 3, Window: time.Minute}, MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	fa, _ := fixed.Take(ctx, "k", 1)
	reads = clock.reads.Load()
	if _, err := fixed.GiveBack(ctx, "k", 1, fa.Receipt); err != nil {
		t.Fatal(err)
	}
	if clock.reads.Load() == reads {
		t.Fatal("a fixed window's give-back read no clock: its reset time needs one")
	}
}

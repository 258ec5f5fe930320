package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// want is the visible part of a Decision a step expects, compared exactly.
type want struct {
	allowed    bool
	remaining  int64
	reset      time.Duration
	retryAfter time.Duration
}

func allow(remaining int64, reset, retry time.Duration) want {
	return want{true, remaining, reset, retry}
}

func deny(remaining int64, reset, retry time.Duration) want {
	return want{false, remaining, reset, retry}
}

// step is one Take (or, with ret, a Return of the last allowed Take) at
// time at after the case's base, which is aligned to the window.
type step struct {
	at   time.Duration
	cost int64
	ret  bool
	want want
}

// take and release build steps.
func take(at time.Duration, cost int64, w want) step { return step{at: at, cost: cost, want: w} }
func release(at time.Duration, cost int64, w want) step {
	return step{at: at, cost: cost, ret: true, want: w}
}

// alignedBase is a realistic Unix time in µs that starts a window of p, so
// steps can name window boundaries by their offset.
func alignedBase(p Policy) int64 {
	w := p.Window.Microseconds()
	return 1_700_000_000_000_000 / w * w
}

// newTestMemory is a memory store of p on a manual clock set to base.
func newTestMemory(t testing.TB, p Policy, opts MemoryOptions) (*Memory, *testutil.Clock) {
	t.Helper()
	clock := &testutil.Clock{}
	clock.SetMicro(alignedBase(p))
	opts.Clock = clock
	m, err := NewMemory(p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, clock
}

// runSteps steps one key of a fresh memory store of p through steps and
// compares every decision exactly.
func runSteps(t *testing.T, p Policy, steps []step) {
	t.Helper()
	m, clock := newTestMemory(t, p, MemoryOptions{})
	base := clock.Now()
	ctx := context.Background()
	var last Admission
	for i, st := range steps {
		clock.Set(base.Add(st.at))
		var d Decision
		if st.ret {
			d, _ = m.GiveBack(ctx, "k", st.cost, last.Receipt)
		} else {
			a, _ := m.Take(ctx, "k", st.cost)
			if a.Allowed {
				last = a
			}
			d = a.Decision
		}
		got := want{d.Allowed, d.Remaining, d.ResetAfter, d.RetryAfter}
		if got != st.want {
			op := "take"
			if st.ret {
				op = "return"
			}
			t.Errorf("step %d (%s cost %d at +%v): got %+v, want %+v", i, op, st.cost, st.at, got, st.want)
		}
	}
}

const (
	us = time.Microsecond
	ms = time.Millisecond
	s  = time.Second
)

// TestWorkedSlidingWindowCounter: 80 in the previous window, 20 in the
// current, 30% into it: est = 80×0.7 + 20 = 76, so 24 more fit and 25 do not.
func TestWorkedSlidingWindowCounter(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowCounter, Events: 100, Window: time.Minute}
	runSteps(t, p, []step{
		take(-60*s, 80, allow(20, 120*s, 0)),
		// est = 80×59/60 + 20 = 98.67.
		take(1*s, 20, allow(1, 119*s, 0)),
		// 30% in: est = 76, remaining 24. 25 more need est <= 75, which
		// prev's decay gives at 80×(42 - x)/60 = 55: x = 0.75 s.
		take(18*s, 25, deny(24, 102*s, 750*ms)),
		take(18*s, 24, allow(0, 102*s, 0)),
	})
}

// TestWorkedTokenBucket: rate 100/1m burst 20 lets 15 through at once,
// leaving 5 tokens; 6 s later 10 more (one per 0.6 s) have been added.
func TestWorkedTokenBucket(t *testing.T) {
	p := Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute, Burst: 20}
	var steps []step
	for i := int64(1); i <= 15; i++ {
		steps = append(steps, take(0, 1, allow(20-i, time.Duration(i)*600*ms, 0)))
	}
	steps = append(steps,
		// 15 tokens now: 16 are refused, one token (0.6 s) short.
		take(6*s, 16, deny(15, 3*s, 600*ms)),
		take(6*s, 1, allow(14, 3600*ms, 0)),
	)
	runSteps(t, p, steps)
}

// TestWorkedWindowBoundary: L requests just before a fixed window ends and
// L just after all pass (2L within a few µs), while a sliding log lets only
// L through in any span of one window.
func TestWorkedWindowBoundary(t *testing.T) {
	const l = 10
	fixed := Policy{Algorithm: FixedWindow, Events: l, Window: time.Minute}
	log := Policy{Algorithm: SlidingWindowLog, Events: l, Window: time.Minute}
	var fixedSteps, logSteps []step
	for i := int64(1); i <= l; i++ {
		fixedSteps = append(fixedSteps, take(-1*us, 1, allow(l-i, 1*us, 0)))
		logSteps = append(logSteps, take(-1*us, 1, allow(l-i, time.Minute, 0)))
	}
	for i := int64(1); i <= l; i++ {
		fixedSteps = append(fixedSteps, take(0, 1, allow(l-i, time.Minute, 0)))
	}
	fixedSteps = append(fixedSteps, take(0, 1, deny(0, time.Minute, time.Minute)))
	logSteps = append(logSteps,
		take(0, 1, deny(0, time.Minute-us, time.Minute-us)),
		take(time.Minute-2*us, 1, deny(0, 1*us, 1*us)),
		// Exactly one window after the first ten they have left.
		take(time.Minute-us, 1, allow(l-1, time.Minute, 0)),
	)
	t.Run("fixed_window", func(t *testing.T) { runSteps(t, fixed, fixedSteps) })
	t.Run("sliding_window_log", func(t *testing.T) { runSteps(t, log, logSteps) })
}

// TestAlgorithmEdges checks each algorithm's formulas where they change
// branch: caps, boundaries, and the three retry_after cases of the counter.
func TestAlgorithmEdges(t *testing.T) {
	zero := time.Duration(0)
	var leaky10 []step // 10/1s, default max_delay 0.9 s: ten held 0.1 s apart
	for i := int64(0); i < 10; i++ {
		leaky10 = append(leaky10, take(0, 1, allow(9-i, time.Duration(i+1)*100*ms, time.Duration(i)*100*ms)))
	}
	leaky10 = append(leaky10, take(0, 1, deny(0, 1*s, 100*ms)))

	cases := []struct {
		name   string
		policy Policy
		steps  []step
	}{
		{
			name:   "token_bucket refill capped at burst",
			policy: Policy{Algorithm: TokenBucket, Events: 10, Window: time.Second, Burst: 5},
			steps: []step{
				take(0, 5, allow(0, 500*ms, 0)),
				take(0, 1, deny(0, 500*ms, 100*ms)),
				take(0, 3, deny(0, 500*ms, 300*ms)),
				take(50*ms, 1, deny(0, 450*ms, 50*ms)),
				// An hour refills 36,000 tokens' worth; the bucket holds 5.
				take(time.Hour, 1, allow(4, 100*ms, 0)),
				take(time.Hour, 5, deny(4, 100*ms, 100*ms)),
				take(time.Hour, 4, allow(0, 500*ms, 0)),
			},
		},
		{
			name:   "leaky_bucket default max_delay admits burst at once",
			policy: Policy{Algorithm: LeakyBucket, Events: 10, Window: time.Second},
			steps:  leaky10,
		},
		{
			// r = 3/s: holds are 1/3 s apart, rounded up to whole µs.
			name:   "leaky_bucket holds spaced exactly 1/r",
			policy: Policy{Algorithm: LeakyBucket, Events: 3, Window: time.Second},
			steps: []step{
				take(0, 1, allow(2, 333334*us, 0)),
				take(0, 1, allow(1, 666667*us, 333334*us)),
				take(0, 1, allow(0, 1*s, 666667*us)),
				take(0, 1, deny(0, 1*s, 333334*us)),
				// The fourth goes at exactly 1 s: held 1 s - 333334 µs.
				take(333334*us, 1, allow(0, 1*s, 666666*us)),
			},
		},
		{
			name:   "leaky_bucket max_delay 0 admits only into an empty queue",
			policy: Policy{Algorithm: LeakyBucket, Events: 10, Window: time.Second, MaxDelay: &zero},
			steps: []step{
				take(0, 1, allow(0, 100*ms, 0)),
				take(0, 1, deny(0, 100*ms, 100*ms)),
				take(50*ms, 1, deny(0, 50*ms, 50*ms)),
				take(100*ms, 1, allow(0, 100*ms, 0)),
			},
		},
		{
			name:   "fixed_window resets at the window end",
			policy: Policy{Algorithm: FixedWindow, Events: 3, Window: time.Second},
			steps: []step{
				take(250*ms, 1, allow(2, 750*ms, 0)),
				take(250*ms, 2, allow(0, 750*ms, 0)),
				take(250*ms, 1, deny(0, 750*ms, 750*ms)),
				take(1*s-1*us, 1, deny(0, 1*us, 1*us)),
				take(1*s, 1, allow(2, 1*s, 0)),
			},
		},
		{
			name:   "sliding_window_log costs and oldest entries leaving",
			policy: Policy{Algorithm: SlidingWindowLog, Events: 5, Window: 10 * time.Second},
			steps: []step{
				take(0, 2, allow(3, 10*s, 0)),
				take(1*s, 1, allow(2, 10*s, 0)),
				take(2*s, 2, allow(0, 10*s, 0)),
				// 3 units must leave: the 2 of t=0 and the 1 of t=1s.
				take(3*s, 3, deny(0, 9*s, 8*s)),
				// 1 unit: the entry of t=0 suffices.
				take(3*s, 1, deny(0, 9*s, 7*s)),
				take(10*s, 2, allow(0, 10*s, 0)),
				// All 5 must leave, the newest at 20 s.
				take(10*s, 5, deny(0, 10*s, 10*s)),
			},
		},
		{
			name:   "sliding_window_counter retry later this window",
			policy: Policy{Algorithm: SlidingWindowCounter, Events: 10, Window: 10 * time.Second},
			steps: []step{
				take(-5*s, 10, allow(0, 15*s, 0)),
				// est = 10×0.8 = 8: 2 fit; then one more needs prev's
				// weighted share <= 7, at e = 3 s.
				take(2*s, 2, allow(0, 18*s, 0)),
				take(2*s, 1, deny(0, 18*s, 1*s)),
				take(3*s, 1, allow(0, 17*s, 0)),
			},
		},
		{
			name:   "sliding_window_counter retry next window",
			policy: Policy{Algorithm: SlidingWindowCounter, Events: 10, Window: 10 * time.Second},
			steps: []step{
				take(5*s, 10, allow(0, 15*s, 0)),
				// Next window, e' into it: 10×(10 - e')/10 + 1 <= 10 at e' = 1 s.
				take(5*s, 1, deny(0, 15*s, 6*s)),
				take(11*s-1*us, 1, deny(0, 9*s+1*us, 1*us)),
				take(11*s, 1, allow(0, 19*s, 0)),
			},
		},
		{
			name:   "sliding_window_counter retry two windows on",
			policy: Policy{Algorithm: SlidingWindowCounter, Events: 10, Window: 10 * time.Second},
			steps: []step{
				take(5*s, 10, allow(0, 15*s, 0)),
				// A full quota must wait until the current count has no weight.
				take(5*s, 10, deny(0, 15*s, 15*s)),
				// est is 10×1µs/10s: 9 whole units fit, not 10.
				take(20*s-1*us, 10, deny(9, 1*us, 1*us)),
				take(20*s, 10, allow(0, 20*s, 0)),
			},
		},
		{
			// A clock read just before the boundary that reaches the store
			// after one read just after it counts in the newer window
			// instead of restarting the older one's count.
			name:   "fixed_window late reading of the previous window",
			policy: Policy{Algorithm: FixedWindow, Events: 2, Window: time.Second},
			steps: []step{
				take(1*s, 1, allow(1, 1*s, 0)),
				take(1*s-1*us, 1, allow(0, 1*s, 0)),
				take(1*s, 1, deny(0, 1*s, 1*s)),
			},
		},
		{
			name:   "sliding_window_counter late reading of the previous window",
			policy: Policy{Algorithm: SlidingWindowCounter, Events: 2, Window: time.Second},
			steps: []step{
				take(1*s, 1, allow(1, 2*s, 0)),
				take(1*s-1*us, 1, allow(0, 2*s, 0)),
				take(1*s, 1, deny(0, 2*s, 1500*ms)),
			},
		},
		{
			name:   "concurrency acquire release never negative",
			policy: Policy{Algorithm: Concurrency, Events: 2, Window: time.Second},
			steps: []step{
				take(0, 1, allow(1, 0, 0)),
				take(0, 1, allow(0, 0, 0)),
				take(0, 1, deny(0, 0, 0)),
				release(0, 1, allow(1, 0, 0)),
				release(0, 1, allow(2, 0, 0)),
				// A stray release cannot create capacity.
				release(0, 1, allow(2, 0, 0)),
				take(0, 2, allow(0, 0, 0)),
				take(0, 1, deny(0, 0, 0)),
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runSteps(t, c.policy, c.steps) })
	}
}

// TestAlgorithmRefundRestores: a Take followed by a Refund of it leaves the
// key as if neither had happened. Two stores share a history; one also
// takes and returns; afterwards both must decide a probe sequence alike.
func TestAlgorithmRefundRestores(t *testing.T) {
	ctx := context.Background()
	for _, a := range Algorithms {
		for _, later := range []time.Duration{0, 300 * ms} {
			t.Run(fmt.Sprintf("%s/return_after_%v", a, later), func(t *testing.T) {
				p := Policy{Algorithm: a, Events: 10, Window: 2 * time.Second}
				ref, refClock := newTestMemory(t, p, MemoryOptions{})
				m, clock := newTestMemory(t, p, MemoryOptions{})
				at := func(d time.Duration) {
					refClock.Set(time.UnixMicro(alignedBase(p)).Add(d))
					clock.Set(refClock.Now())
				}
				// History: 3 units in the previous window and 4 in this
				// one, so every algorithm holds non-trivial state.
				for _, h := range []struct {
					at   time.Duration
					cost int64
				}{{-1500 * ms, 2}, {-500 * ms, 1}, {100 * ms, 3}, {200 * ms, 1}} {
					at(h.at)
					ref.Take(ctx, "k", h.cost)
					m.Take(ctx, "k", h.cost)
				}
				at(250 * ms)
				d, _ := m.Take(ctx, "k", 2)
				if !d.Allowed {
					t.Fatalf("take of 2 denied: %+v", d)
				}
				at(250*ms + later)
				m.GiveBack(ctx, "k", 2, d.Receipt)
				for i, probe := range []time.Duration{0, 100 * ms, 900 * ms, 1900 * ms, 2500 * ms} {
					at(250*ms + later + probe)
					for _, cost := range []int64{1, 3} {
						want, _ := ref.Take(ctx, "k", cost)
						got, _ := m.Take(ctx, "k", cost)
						// An admission's epoch names the store's
						// state (Receipt.Epoch), which may differ
						// between two stores.
						got.Receipt.Epoch, want.Receipt.Epoch = 0, 0
						// The two admissions name different stores: compare
						// what they report and their receipts.
						if got.Decision != want.Decision || got.Receipt != want.Receipt {
							t.Fatalf("probe %d cost %d: after take+return %+v, never taken %+v", i, cost, got, want)
						}
					}
				}
			})
		}
	}
}

package limiter

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The rule a take or charge used before epochs.judge (e91c98d):
// shard.state gave the state a new epoch when empty(p, now) held, checked
// before the algorithm ran. These are those empty methods, verbatim.
func oldEmptyBucket(s *bucketState, p *params, now int64) bool { return s.debt(p, now) == 0 }

func oldEmptyFixed(s *fixedWindowState, p *params, now int64) bool {
	win, _ := windowOf(p, now)
	return win > s.win || win == s.win && s.count == 0
}

func oldEmptyCounter(s *slidingCounterState, p *params, now int64) bool {
	switch idx := windowIndex(p, now); {
	case idx < s.win:
		return false
	case idx == s.win:
		return s.prev == 0 && s.cur == 0
	case idx == s.win+1:
		return s.cur == 0
	}
	return true
}

func oldEmptyLog(s *slidingLogState, p *params, now int64) bool {
	n := len(s.ents)
	return n == s.head || logAt(s.ents[n-1]) <= max(now, 0)-p.w
}

// reviewRule drives one algorithm's state through random takes, leases,
// charges and give-backs on a clock that steps back and forth, and checks
// that each take and charge gives a new epoch exactly when the old rule
// would have.
func reviewRule[S any, PS keyState[S]](t *testing.T, pol Policy, oldEmpty func(*S, *params, int64) bool) {
	pv, err := pol.compile()
	p := &pv
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 200; run++ {
		var st S
		var epoch, epochCount uint64
		now := int64(1_000_000_000)
		// held is what the takes admitted still hold: units of the
		// state epoch names, by name (Receipt.Name).
		type hold struct {
			units, name int64
			epoch       uint64
		}
		var held []hold
		for step := 0; step < 300; step++ {
			switch rng.IntN(6) {
			case 0:
				now -= rng.Int64N(p.w)
			case 1, 2:
				now += rng.Int64N(p.w / 2)
			case 3:
				now += rng.Int64N(3 * p.w)
			}
			by := epochs{cell: &epoch, shard: &epochCount}
			want := oldEmpty(&st, p, now)
			before := epochCount
			op := rng.IntN(5)
			switch {
			case op == 0 && p.alg.Charges:
				PS(&st).charge(p, now, 1+rng.Int64N(3), by)
			case op == 1 && len(held) > 0:
				i := rng.IntN(len(held))
				h := held[i]
				if h.epoch == epoch {
					PS(&st).refund(p, now, h.units, h.name)
				}
				held = append(held[:i], held[i+1:]...)
				continue
			default:
				cost := 1 + rng.Int64N(2)
				w := cost
				if p.alg.Leases && rng.IntN(2) == 0 {
					w = cost + rng.Int64N(4)
				}
				t, at, mark := PS(&st).take(p, now, cost, w, by)
				if t.units >= 0 {
					held = append(held, hold{t.units, Receipt{At: at, Mark: mark}.Name(), epoch})
				}
			}
			if got := epochCount != before; got != want {
				t.Fatalf("%s run %d step %d op %d at %d: new epoch %v, old rule %v", pol.Algorithm, run, step, op, now, got, want)
			}
		}
	}
}

// TestEpochRuleMatchesOldEmpty: each algorithm's take and charge give the
// state a new epoch (epochs.judge) exactly when the empty rule the
// memory store checked before them (until e91c98d) held, on clocks that
// step back and forth, with leases logged ahead, charges and give-backs.
func TestEpochRuleMatchesOldEmpty(t *testing.T) {
	t.Run("token", func(t *testing.T) {
		reviewRule[tokenBucketState](t, Policy{Algorithm: TokenBucket, Events: 5, Window: time.Second, Burst: 3},
			func(s *tokenBucketState, p *params, now int64) bool { return oldEmptyBucket(&s.bucketState, p, now) })
	})
	t.Run("leaky", func(t *testing.T) {
		d := 500 * time.Millisecond
		reviewRule[leakyBucketState](t, Policy{Algorithm: LeakyBucket, Events: 5, Window: time.Second, MaxDelay: &d},
			func(s *leakyBucketState, p *params, now int64) bool { return oldEmptyBucket(&s.bucketState, p, now) })
	})
	t.Run("concurrency", func(t *testing.T) {
		reviewRule[concurrencyState](t, Policy{Algorithm: Concurrency, Events: 3, Window: time.Second},
			func(s *concurrencyState, p *params, now int64) bool { return s.inFlight == 0 })
	})
	t.Run("fixed", func(t *testing.T) {
		reviewRule[fixedWindowState](t, Policy{Algorithm: FixedWindow, Events: 5, Window: time.Second}, oldEmptyFixed)
	})
	t.Run("calendar", func(t *testing.T) {
		reviewRule[fixedWindowState](t, Policy{Algorithm: FixedWindow, Events: 5, Calendar: &Calendar{Period: Day, Location: time.UTC}}, oldEmptyFixed)
	})
	t.Run("counter", func(t *testing.T) {
		reviewRule[slidingCounterState](t, Policy{Algorithm: SlidingWindowCounter, Events: 5, Window: time.Second}, oldEmptyCounter)
	})
	t.Run("log", func(t *testing.T) {
		reviewRule[slidingLogState](t, Policy{Algorithm: SlidingWindowLog, Events: 5, Window: time.Second}, oldEmptyLog)
	})
}

package limiter

import (
	"strings"
	"testing"
	"time"
)

func TestPolicyValidate(t *testing.T) {
	neg := -time.Second
	long := 1 << 62 * time.Nanosecond
	ok := Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute}
	with := func(f func(*Policy)) Policy { p := ok; f(&p); return p }
	cases := []struct {
		name   string
		policy Policy
		errHas string // "" means valid
	}{
		{"valid", ok, ""},
		{"every algorithm", with(func(p *Policy) { p.Algorithm = Concurrency }), ""},
		{"unknown algorithm", with(func(p *Policy) { p.Algorithm = "token-bucket" }), "unknown algorithm"},
		{"empty algorithm", with(func(p *Policy) { p.Algorithm = "" }), "unknown algorithm"},
		{"zero events", with(func(p *Policy) { p.Events = 0 }), "events must be positive"},
		{"negative events", with(func(p *Policy) { p.Events = -1 }), "events must be positive"},
		{"zero window", with(func(p *Policy) { p.Window = 0 }), "window"},
		{"negative window", with(func(p *Policy) { p.Window = -time.Second }), "window"},
		{"sub-microsecond window", with(func(p *Policy) { p.Window = 999 }), "window"},
		{"negative burst", with(func(p *Policy) { p.Burst = -1 }), "burst must not be negative"},
		{"huge events×window", with(func(p *Policy) { p.Events = 1 << 40; p.Window = time.Hour }), "too large"},
		{"huge burst×window", with(func(p *Policy) { p.Burst = 1 << 40; p.Window = time.Hour }), "too large"},
		{"large events×window within bounds", with(func(p *Policy) { p.Events = 1 << 29; p.Window = 1 << 30 * time.Microsecond }), ""},
		{"events×window at the bound", with(func(p *Policy) { p.Events = 1 << 30; p.Window = 1 << 30 * time.Microsecond }), "too large"},
		{"negative max_delay", Policy{Algorithm: LeakyBucket, Events: 10, Window: time.Second, MaxDelay: &neg}, "max_delay"},
		{"huge max_delay", Policy{Algorithm: LeakyBucket, Events: 1 << 20, Window: time.Second, MaxDelay: &long}, "max_delay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.policy.Validate()
			switch {
			case c.errHas == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case c.errHas != "" && err == nil:
				t.Fatalf("Validate accepted %+v, want an error about %q", c.policy, c.errHas)
			case c.errHas != "" && !strings.Contains(err.Error(), c.errHas):
				t.Fatalf("Validate: %v, want it to mention %q", err, c.errHas)
			}
			if _, merr := NewMemory(c.policy, MemoryOptions{}); (merr == nil) != (err == nil) {
				t.Fatalf("NewMemory error %v disagrees with Validate %v", merr, err)
			}
		})
	}
}

func TestPolicyQuota(t *testing.T) {
	cases := []struct {
		policy Policy
		q      int64
		w      time.Duration
	}{
		// Twenty at once, refilled from empty in 20/(100/min) = 12 s.
		{Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute, Burst: 20}, 20, 12 * time.Second},
		{Policy{Algorithm: LeakyBucket, Events: 100, Window: time.Minute, Burst: 20}, 20, 12 * time.Second},
		// Default burst: the configured L per W.
		{Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute}, 100, time.Minute},
		// B/r = 1/3 s, rounded up to whole µs.
		{Policy{Algorithm: TokenBucket, Events: 3, Window: time.Second, Burst: 1}, 1, 333334 * time.Microsecond},
		{Policy{Algorithm: FixedWindow, Events: 100, Window: time.Minute, Burst: 20}, 100, time.Minute},
		{Policy{Algorithm: SlidingWindowLog, Events: 5, Window: time.Second}, 5, time.Second},
		{Policy{Algorithm: SlidingWindowCounter, Events: 5, Window: time.Second}, 5, time.Second},
		{Policy{Algorithm: Concurrency, Events: 8, Window: time.Minute}, 8, time.Minute},
	}
	for _, c := range cases {
		t.Run(c.policy.String(), func(t *testing.T) {
			q, w := c.policy.Quota()
			if q != c.q || w != c.w {
				t.Fatalf("Quota() = %d, %v; want %d, %v", q, w, c.q, c.w)
			}
		})
	}
}

func TestPolicyMaxCost(t *testing.T) {
	for _, c := range []struct {
		policy Policy
		want   int64
	}{
		{Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute, Burst: 20}, 20},
		{Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute}, 100},
		{Policy{Algorithm: LeakyBucket, Events: 100, Window: time.Minute, Burst: 7}, 7},
		{Policy{Algorithm: FixedWindow, Events: 100, Window: time.Minute, Burst: 20}, 100},
	} {
		if got := c.policy.MaxCost(); got != c.want {
			t.Errorf("%s: MaxCost() = %d, want %d", c.policy, got, c.want)
		}
	}
}

// TestPolicyString: String is the identity of a policy's state, so it must
// change with every field that changes decisions, and not otherwise.
func TestPolicyString(t *testing.T) {
	d0, d1, d1b := time.Duration(0), 100*time.Millisecond, 100*time.Millisecond
	base := Policy{Algorithm: LeakyBucket, Events: 10, Window: time.Second, Burst: 5, MaxDelay: &d1}
	variants := map[string]Policy{
		"algorithm": {Algorithm: TokenBucket, Events: 10, Window: time.Second, Burst: 5, MaxDelay: &d1},
		"events":    {Algorithm: LeakyBucket, Events: 11, Window: time.Second, Burst: 5, MaxDelay: &d1},
		"window":    {Algorithm: LeakyBucket, Events: 10, Window: time.Second + time.Microsecond, Burst: 5, MaxDelay: &d1},
		"burst":     {Algorithm: LeakyBucket, Events: 10, Window: time.Second, Burst: 6, MaxDelay: &d1},
		"max_delay": {Algorithm: LeakyBucket, Events: 10, Window: time.Second, Burst: 5, MaxDelay: &d0},
		"no max":    {Algorithm: LeakyBucket, Events: 10, Window: time.Second, Burst: 5},
	}
	seen := map[string]string{base.String(): "base"}
	for name, v := range variants {
		s := v.String()
		if other, dup := seen[s]; dup {
			t.Errorf("%s and %s share String %q", name, other, s)
		}
		seen[s] = name
	}
	same := []Policy{
		// A different pointer to the same max_delay.
		{Algorithm: LeakyBucket, Events: 10, Window: time.Second, Burst: 5, MaxDelay: &d1b},
	}
	for _, p := range same {
		if p.String() != base.String() {
			t.Errorf("%q differs from %q for the same decisions", p.String(), base.String())
		}
	}
	// A burst equal to events is the default burst.
	a := Policy{Algorithm: TokenBucket, Events: 10, Window: time.Second}
	b := Policy{Algorithm: TokenBucket, Events: 10, Window: time.Second, Burst: 10}
	if a.String() != b.String() {
		t.Errorf("default burst %q and explicit burst = events %q differ", a.String(), b.String())
	}
}

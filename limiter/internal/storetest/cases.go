// Package storetest is test machinery shared by the tests of limiter and
// of the stores beside it (limiter/redisstore, limiter/nearcache): the
// table of algorithm cases every store must decide alike, and helpers for
// tests that run Redis. It is imported by tests only.
package storetest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	_ "time/tzdata" // the calendar cases' time zones, whatever the OS has

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// algorithmCase is one case of limiter/testdata/algorithm_cases.json, the expected
// decisions of an exact reference model (see its "about" field).
type algorithmCase struct {
	Name   string `json:"name"`
	Policy struct {
		Algorithm limiter.Algorithm `json:"algorithm"`
		L         int64             `json:"L"`
		W         int64             `json:"W"`
		B         int64             `json:"B"`
		MaxDelay  *int64            `json:"max_delay"`
		// Calendar aligns a fixed window to a time zone's days, weeks or
		// months; W is then absent.
		Calendar *struct {
			Period   limiter.Period `json:"period"`
			TimeZone string         `json:"time_zone"`
		} `json:"calendar"`
	} `json:"policy"`
	Steps []struct {
		T        int64  `json:"t_us"`
		Cost     int64  `json:"cost"`
		Op       string `json:"op"`
		Boundary bool   `json:"boundary"`
		Expect   struct {
			Allowed    bool  `json:"allowed"`
			Remaining  int64 `json:"remaining"`
			ResetUs    int64 `json:"reset_us"`
			RetryAfter int64 `json:"retry_after_us"`
		} `json:"expect"`
	} `json:"steps"`
}

func (c *algorithmCase) policy(t testing.TB) limiter.Policy {
	p := limiter.Policy{
		Algorithm: c.Policy.Algorithm,
		Events:    c.Policy.L,
		Window:    time.Duration(c.Policy.W) * time.Microsecond,
		Burst:     c.Policy.B,
	}
	if c.Policy.MaxDelay != nil {
		d := time.Duration(*c.Policy.MaxDelay) * time.Microsecond
		p.MaxDelay = &d
	}
	if cal := c.Policy.Calendar; cal != nil {
		loc, err := time.LoadLocation(cal.TimeZone)
		if err != nil {
			t.Fatal(err)
		}
		p.Calendar = &limiter.Calendar{Period: cal.Period, Location: loc}
	}
	return p
}

// casesFile is limiter/testdata/algorithm_cases.json, found from this
// file's directory, so the tests of every package beside limiter read it.
func casesFile() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "testdata", "algorithm_cases.json")
}

func loadAlgorithmCases(t testing.TB) []algorithmCase {
	t.Helper()
	raw, err := os.ReadFile(casesFile())
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []algorithmCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) == 0 {
		t.Fatal("no cases in limiter/testdata/algorithm_cases.json")
	}
	return file.Cases
}

// CaseStore opens a fresh store for one case: Store enforcing p, and a
// function that sets the store's clock to t microseconds.
type CaseStore func(t *testing.T, p limiter.Policy) (limiter.Store, func(us int64))

// RunAlgorithmCases steps every case through stores made by open and checks
// each decision (a take's; a release's, a Refund of part or all of the last
// admission; a charge's, Charger.Charge, past the limit if need be):
// allowed and remaining exactly, reset and retry_after within
// the file's 1000 µs tolerance. Every step is compared, boundary steps
// included, since the stores use exact arithmetic. After each step, Peek
// must report the same remaining and reset, and (the next step checks)
// consume nothing.
func RunAlgorithmCases(t *testing.T, open CaseStore) {
	steps := 0
	for _, c := range loadAlgorithmCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			store, setNow := open(t, c.policy(t))
			ctx := context.Background()
			var last limiter.Admission
			for i, st := range c.Steps {
				cost := st.Cost
				if cost == 0 {
					cost = 1
				}
				setNow(st.T)
				var d limiter.Decision
				var err error
				switch st.Op {
				case "release":
					d, err = store.GiveBack(ctx, "k", cost, last.Receipt)
				case "charge":
					ch, ok := store.(limiter.Charger)
					if !ok {
						t.Fatalf("step %d: a %T cannot charge", i, store)
					}
					var a limiter.Admission
					a, err = ch.Charge(ctx, "k", cost)
					d = a.Decision
				default:
					var a limiter.Admission
					a, err = store.Take(ctx, "k", cost)
					if a.Allowed {
						last = a
					}
					d = a.Decision
				}
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				e := st.Expect
				if d.Allowed != e.Allowed || d.Remaining != e.Remaining ||
					!within(d.ResetAfter, e.ResetUs) || !within(d.RetryAfter, e.RetryAfter) {
					t.Fatalf("step %d (t=%dus cost=%d %s boundary=%v): got allowed=%v remaining=%d reset=%dus retry=%dus; want allowed=%v remaining=%d reset=%dus retry=%dus",
						i, st.T, cost, st.Op, st.Boundary, d.Allowed, d.Remaining, d.ResetAfter.Microseconds(), d.RetryAfter.Microseconds(),
						e.Allowed, e.Remaining, e.ResetUs, e.RetryAfter)
				}
				// A look at the state right after, at the same time, sees
				// what the step reported and changes nothing.
				peek, err := store.Peek(ctx, "k")
				if err != nil {
					t.Fatalf("step %d: peek: %v", i, err)
				}
				if peek.Remaining != e.Remaining || !within(peek.ResetAfter, e.ResetUs) {
					t.Fatalf("step %d (t=%dus): peek remaining=%d reset=%dus; the step reported remaining=%d reset=%dus",
						i, st.T, peek.Remaining, peek.ResetAfter.Microseconds(), e.Remaining, e.ResetUs)
				}
				steps++
			}
		})
	}
	t.Logf("%d steps matched", steps)
}

func within(got time.Duration, wantUs int64) bool {
	diff := got.Microseconds() - wantUs
	return diff >= -1000 && diff <= 1000
}

// RunCostBelowOneCases: a take or lease of a cost below 1 is an error in
// every store, for every algorithm, and leaves the key's state as it
// was. A negative cost taken as asked would credit the key (a bucket
// refilled, a window's count lowered, a log entry of -1 units), and the
// memory store once answered it as a refusal while doing so.
func RunCostBelowOneCases(t *testing.T, open CaseStore) {
	for _, alg := range limiter.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			p := limiter.Policy{Algorithm: alg, Events: 3, Window: time.Hour}
			s, setNow := open(t, p)
			setNow(AlignedBase(p))
			ctx := context.Background()
			MustAdmit(t, s, "k")
			before, err := s.Peek(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			for _, cost := range []int64{0, -1, -5} {
				if a, err := s.Take(ctx, "k", cost); err == nil {
					t.Errorf("Take of cost %d: %+v and no error", cost, a.Decision)
				}
				if l, ok := s.(limiter.Leaser); ok && alg.Traits().Leases {
					if a, err := l.TakeUpTo(ctx, "k", cost, 2); err == nil {
						t.Errorf("TakeUpTo of cost %d: %+v and no error", cost, a.Decision)
					}
				}
			}
			after, err := s.Peek(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if after.Remaining != before.Remaining || after.ResetAfter != before.ResetAfter {
				t.Errorf("state after the refused costs: remaining %d reset %v; before: remaining %d reset %v",
					after.Remaining, after.ResetAfter, before.Remaining, before.ResetAfter)
			}
		})
	}
}

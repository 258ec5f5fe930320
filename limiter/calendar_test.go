package limiter

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // every zone below, whatever the OS has

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestCalendarWindow: windows begin at local midnight, on Monday, on the
// 1st, and last what the calendar makes them last. The expected instants
// are written with their UTC offsets by hand.
func TestCalendarWindow(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		period     Period
		zone       string
		t          string
		start, end string
	}{
		{Day, "Europe/Berlin", "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00"},
		{Day, "Europe/Berlin", "2026-10-25T02:30:00+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"},
		{Day, "UTC", "2026-12-31T23:59:59Z", "2026-12-31T00:00:00Z", "2027-01-01T00:00:00Z"},
		{Day, "", "2026-06-01T00:00:00Z", "2026-06-01T00:00:00Z", "2026-06-02T00:00:00Z"},
		// Santiago springs forward at midnight: 10 October 2010 begins at 01:00.
		{Day, "America/Santiago", "2010-10-10T12:00:00-03:00", "2010-10-10T01:00:00-03:00", "2010-10-11T00:00:00-03:00"},
		{Week, "UTC", "2027-01-03T23:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		{Week, "Europe/Berlin", "2026-03-23T00:00:00+01:00", "2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00"},
		{Month, "America/New_York", "2027-01-01T00:00:00Z", "2026-12-01T00:00:00-05:00", "2027-01-01T00:00:00-05:00"},
		{Month, "Europe/Berlin", "2028-02-29T23:59:59+01:00", "2028-02-01T00:00:00+01:00", "2028-03-01T00:00:00+01:00"},
		{Month, "Asia/Kathmandu", "2026-05-31T18:14:59Z", "2026-05-01T00:00:00+05:45", "2026-06-01T00:00:00+05:45"},
	}
	for _, c := range cases {
		var loc *time.Location
		if c.zone != "" {
			loc = testutil.MustLoad(t, c.zone)
		}
		cal := Calendar{Period: c.period, Location: loc}
		start, end := cal.Window(at(c.t))
		if !start.Equal(at(c.start)) || !end.Equal(at(c.end)) {
			t.Errorf("%s at %s: window [%s, %s), want [%s, %s)", cal, c.t, start, end, c.start, c.end)
		}
	}
}

// TestCalendarWindowsTileTime walks twenty years window by window in zones
// whose clocks change at midnight (Santiago, Havana, Beirut), by half an
// hour (Lord Howe), skipped a whole date (Apia, 30 December 2011) or
// never change (Kathmandu): consecutive windows meet, each begins on the
// first instant of a date that starts its period (any date, a Monday, a
// 1st), and every instant within is placed in it, by the compiled windows
// too.
func TestCalendarWindowsTileTime(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/Santiago", "America/Havana", "Asia/Beirut",
		"Australia/Lord_Howe", "Pacific/Apia", "Asia/Kathmandu", "America/St_Johns"}
	rng := rand.New(rand.NewPCG(1, 2))
	from := time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	to := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for _, name := range zones {
		loc := testutil.MustLoad(t, name)
		for _, period := range Periods {
			cal := Calendar{Period: period, Location: loc}
			cw := newCalendarWindows(cal)
			start, _ := cal.bounds(from)
			for start < to {
				s, end := cal.bounds(start)
				if s != start || end <= start {
					t.Fatalf("%s: the window at %d is [%d, %d)", cal, start, s, end)
				}
				local := time.UnixMicro(start).In(loc)
				if prev := time.UnixMicro(start - 1).In(loc); prev.YearDay() == local.YearDay() {
					t.Fatalf("%s: window begins at %s, not on a date's first instant", cal, local)
				}
				if period == Week && local.Weekday() != time.Monday && name != "Pacific/Apia" {
					t.Fatalf("%s: week begins on %s", cal, local)
				}
				if period == Month && local.Day() != 1 {
					t.Fatalf("%s: month begins on %s", cal, local)
				}
				for range 3 {
					us := start + rng.Int64N(end-start)
					if s, e := cal.bounds(us); s != start || e != end {
						t.Fatalf("%s: %s placed in [%d, %d), want [%d, %d)", cal, time.UnixMicro(us).In(loc), s, e, start, end)
					}
					if s, e := cw.At(us); s != start || e != end {
						t.Fatalf("%s: compiled windows place %d in [%d, %d), want [%d, %d)", cal, us, s, e, start, end)
					}
				}
				if e := cw.endOf(start); e != end {
					t.Fatalf("%s: endOf(%d) = %d, want %d", cal, start, e, end)
				}
				start = end
			}
		}
	}
}

// TestPolicyCalendar: a calendar is a fixed window's alone, replaces its
// window, and is part of the policy's identity.
func TestPolicyCalendar(t *testing.T) {
	berlin := testutil.MustLoad(t, "Europe/Berlin")
	month := &Calendar{Period: Month, Location: berlin}
	ok := Policy{Algorithm: FixedWindow, Events: 10_000, Calendar: month}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for name, c := range map[string]struct {
		p      Policy
		errHas string
	}{
		"token bucket":  {Policy{Algorithm: TokenBucket, Events: 10, Calendar: month}, "applies only to fixed_window"},
		"sliding":       {Policy{Algorithm: SlidingWindowCounter, Events: 10, Calendar: month}, "applies only to fixed_window"},
		"with a window": {Policy{Algorithm: FixedWindow, Events: 10, Window: time.Hour, Calendar: month}, "takes no window"},
		"bad period":    {Policy{Algorithm: FixedWindow, Events: 10, Calendar: &Calendar{Period: "year"}}, "unknown calendar period"},
		"burst":         {Policy{Algorithm: FixedWindow, Events: 10, Burst: 5, Calendar: month}, "takes no burst"},
		"huge events":   {Policy{Algorithm: FixedWindow, Events: 1 << 60, Calendar: month}, "too large"},
	} {
		err := c.p.Validate()
		if err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%s: Validate = %v, want an error about %q", name, err, c.errHas)
		}
	}

	seen := map[string]bool{}
	for _, p := range []Policy{
		ok,
		{Algorithm: FixedWindow, Events: 10_000, Calendar: &Calendar{Period: Day, Location: berlin}},
		{Algorithm: FixedWindow, Events: 10_000, Calendar: &Calendar{Period: Month}},
		{Algorithm: FixedWindow, Events: 10_001, Calendar: month},
		{Algorithm: FixedWindow, Events: 10_000, Window: 31 * 24 * time.Hour},
	} {
		if seen[p.String()] {
			t.Errorf("two policies share String %q", p.String())
		}
		seen[p.String()] = true
	}
	utc := Policy{Algorithm: FixedWindow, Events: 5, Calendar: &Calendar{Period: Day, Location: time.UTC}}
	none := Policy{Algorithm: FixedWindow, Events: 5, Calendar: &Calendar{Period: Day}}
	if utc.String() != none.String() {
		t.Errorf("UTC %q and the default zone %q differ", utc.String(), none.String())
	}

	for _, c := range []struct {
		t string
		w time.Duration
	}{
		{"2026-05-10T12:00:00+02:00", 31 * 24 * time.Hour},
		{"2026-03-10T12:00:00+01:00", 31*24*time.Hour - time.Hour}, // springs forward on the 29th
		{"2026-10-31T12:00:00+01:00", 31*24*time.Hour + time.Hour}, // falls back on the 25th
		{"2026-02-10T12:00:00+01:00", 28 * 24 * time.Hour},
	} {
		at, _ := time.Parse(time.RFC3339, c.t)
		if q, w := ok.QuotaAt(at); q != 10_000 || w != c.w {
			t.Errorf("QuotaAt(%s) = %d, %v; want 10000, %v", c.t, q, w, c.w)
		}
	}
}

// TestCalendarMemorySweepAndReset: a memory store keeps a key while its
// calendar window counts units, forgets it once the window has ended, and
// Reset reports state only while the window holds some.
func TestCalendarMemorySweepAndReset(t *testing.T) {
	ctx := context.Background()
	ny := testutil.MustLoad(t, "America/New_York")
	clock := testutil.NewClock(time.Date(2026, 12, 31, 23, 0, 0, 0, ny))
	m, err := NewMemory(Policy{Algorithm: FixedWindow, Events: 3, Calendar: &Calendar{Period: Month, Location: ny}}, MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if d, _ := m.Take(ctx, k, 1); !d.Allowed || d.ResetAfter != time.Hour {
			t.Fatalf("take %s: %+v, want an admission resetting at New York's new year, an hour away", k, d)
		}
	}
	if n := m.Sweep(); n != 0 || m.Len() != 2 {
		t.Fatalf("swept %d in the window, %d kept; want 0 and 2", n, m.Len())
	}
	if existed, _ := m.Reset(ctx, "a"); !existed {
		t.Fatal("reset of a counting key: no state")
	}
	clock.Set(time.Date(2027, 1, 1, 0, 0, 0, 0, ny))
	if d, _ := m.Peek(ctx, "b"); d.Remaining != 3 || d.ResetAfter != 0 {
		t.Fatalf("peek in the new month: %+v, want a fresh key", d)
	}
	if existed, _ := m.Reset(ctx, "b"); existed {
		t.Fatal("reset of a key whose month ended: state reported")
	}
	m.Take(ctx, "c", 1)
	clock.Set(time.Date(2027, 2, 1, 0, 0, 0, 0, ny))
	if n := m.Sweep(); n != 1 || m.Len() != 0 {
		t.Fatalf("swept %d after the month, %d kept; want 1 and 0", n, m.Len())
	}
}

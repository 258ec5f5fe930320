package limiter

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // every zone below, whatever the OS has

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

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
			loc = mustLoad(t, c.zone)
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
		loc := mustLoad(t, name)
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
					if s, e := cw.at(us); s != start || e != end {
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
	berlin := mustLoad(t, "Europe/Berlin")
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

// TestCalendarLeaseEndsWithItsWindow: a lease granted just before local
// midnight is spent from only until midnight, and the first request of
// the new day goes to the store.
func TestCalendarLeaseEndsWithItsWindow(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 100, Calendar: &Calendar{Period: Day, Location: mustLoad(t, "Europe/Berlin")}}
	midnight := time.Date(2026, 3, 30, 0, 0, 0, 0, mustLoad(t, "Europe/Berlin"))
	clock := testutil.NewClock(midnight.Add(-LeaseLifetime / 2))
	cache, store := newTestCache(t, p, clock, NearCacheOptions{LeaseFraction: 0.2})
	take := func() Decision { t.Helper(); return mustAdmit(t, cache, "k").Decision }
	for range 4 { // leases of 1 and 2 used up, then one of 4
		take()
	}
	if d := take(); d.Source != SourceLease || d.ResetAfter != LeaseLifetime/2 {
		t.Fatalf("%+v: want a lease decision resetting at midnight, %v away", d, LeaseLifetime/2)
	}
	clock.Advance(LeaseLifetime/2 - time.Microsecond)
	if d := take(); d.Source != SourceLease {
		t.Fatalf("just before midnight: source %v, want lease", d.Source)
	}
	clock.Advance(time.Microsecond)
	d := take()
	if d.Source != SourceStore || d.ResetAfter != 24*time.Hour {
		t.Fatalf("at midnight: %+v; want the store's decision, 24h to the next midnight", d)
	}
	if err := cache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Memory.Take(ctx, "k", 1); st.Remaining != 100-2 {
		t.Fatalf("the new day has %d left after Close, want 98", st.Remaining)
	}
}

// TestCalendarRedisServerTime: with Redis's TIME as the clock, a calendar
// day is counted and reset at the coming UTC midnight, and its key lives
// exactly until then.
func TestCalendarRedisServerTime(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 2, Calendar: &Calendar{Period: Day}}
	r := newTestRedis(t, client, p, RedisOptions{Zone: "cal", Timeout: 5 * time.Second})
	for i, want := range []bool{true, true, false} {
		d, err := r.Take(ctx, "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("take %d: %+v, %v; want allowed %v", i, d, err, want)
		}
		end := d.At().Add(d.ResetAfter)
		if end.UTC().Format(time.TimeOnly) != "00:00:00" || end.Sub(d.At()) > 24*time.Hour {
			t.Fatalf("take %d resets at %s, want the coming UTC midnight", i, end.UTC())
		}
	}
	ttl, err := client.PTTL(ctx, r.Key("k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	_, end := p.Calendar.Window(time.Now())
	if left := time.Until(end); ttl < left-2*time.Second || ttl > left+2*time.Second {
		t.Fatalf("key lives %v, the window %v more", ttl, left)
	}
}

// TestCalendarRedisWindowsAroundTheInstance: the script decides in the
// window, among those the instance sent, that holds Redis's TIME, so an
// instance whose clock is already in the next day still counts in
// Redis's day; one whose windows hold no part of Redis's time gets an
// error, for the fail mode, not a decision in a window nobody named.
func TestCalendarRedisWindowsAroundTheInstance(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 5, Calendar: &Calendar{Period: Day}}
	r := newTestRedis(t, client, p, RedisOptions{Zone: "cal", Timeout: 5 * time.Second})
	cw := newCalendarWindows(*p.Calendar)
	run := func(instance time.Time) ([]int64, error) {
		w := cw.around(instance.UnixMicro())
		args := append([]any{1, "", p.Events}, w.args[:]...)
		return r.script.Run(ctx, client, []string{r.Key("skewed")}, args...).Int64Slice()
	}
	now := time.Now()
	reply, err := run(now.Add(24 * time.Hour)) // the instance a day ahead
	if err != nil {
		t.Fatal(err)
	}
	_, end := p.Calendar.Window(time.UnixMicro(reply[4]))
	if reply[0] != 1 || reply[1] != 4 || reply[2] != end.Sub(time.UnixMicro(reply[4])).Microseconds() {
		t.Fatalf("reply %v: want an admission with 4 left, counted in Redis's day ending %s", reply, end)
	}
	if _, err := run(now.Add(3 * 24 * time.Hour)); err == nil || !strings.Contains(err.Error(), "not within the windows") {
		t.Fatalf("windows three days ahead: %v, want an error", err)
	}
}

// TestCalendarMemorySweepAndReset: a memory store keeps a key while its
// calendar window counts units, forgets it once the window has ended, and
// Reset reports state only while the window holds some.
func TestCalendarMemorySweepAndReset(t *testing.T) {
	ctx := context.Background()
	ny := mustLoad(t, "America/New_York")
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

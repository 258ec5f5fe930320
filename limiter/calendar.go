package limiter

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Period is the length of a calendar window: what an API sells as "per
// day", "per week" or "per month", which a Window of fixed length cannot
// say once a day has 23 or 25 hours or a month 28 to 31 days.
type Period string

// The calendar periods.
const (
	// Day windows begin at local midnight.
	Day Period = "day"
	// Week windows begin at local midnight on Monday (ISO 8601).
	Week Period = "week"
	// Month windows begin at local midnight on the 1st.
	Month Period = "month"
)

// Periods lists every Period, in the order the documentation presents them.
var Periods = []Period{Day, Week, Month}

// Calendar aligns a FixedWindow policy's windows to the calendar of a time
// zone instead of to multiples of Window since the Unix epoch, so a quota
// "per month in the customer's time zone" resets when that customer's
// month begins. Windows are as long as the calendar makes them: a day that
// changes to or from daylight saving time lasts 23 or 25 hours, February
// 28 or 29 days.
type Calendar struct {
	// Period is the window: a day, a week or a month.
	Period Period
	// Location is the time zone whose midnights begin windows; nil means
	// UTC. Its String is part of the policy's identity (Policy.String),
	// so it should be a zone loaded by its IANA name (time.LoadLocation),
	// which every instance resolves alike.
	Location *time.Location
}

// location is c's time zone, UTC when none is set.
func (c Calendar) location() *time.Location {
	if c.Location == nil {
		return time.UTC
	}
	return c.Location
}

// String names the calendar as policies and Redis keys do: "month@Europe/Berlin".
func (c Calendar) String() string {
	return string(c.Period) + "@" + c.location().String()
}

// Validate reports why c cannot align windows, or nil.
func (c Calendar) Validate() error {
	switch c.Period {
	case Day, Week, Month:
		return nil
	}
	return fmt.Errorf("unknown calendar period %q (want one of %v)", c.Period, Periods)
}

// Window is the calendar window t falls in: it begins at start and ends at
// end, exclusive. Its length is what the window really lasts, 23 hours
// for a day that springs forward.
func (c Calendar) Window(t time.Time) (start, end time.Time) {
	s, e := c.bounds(t.UnixMicro())
	return time.UnixMicro(s).In(c.location()), time.UnixMicro(e).In(c.location())
}

// bounds is the window us (µs since the epoch) falls in, [start, end) in
// µs: the first instants of the local dates that begin it and the next
// one (see midnight). Each date's first instant is one instant, so
// consecutive windows meet. The loop moves to the neighbouring window
// should a zone's history place that instant past us (or the window's
// end before it), so start <= us < end always holds.
func (c Calendar) bounds(us int64) (start, end int64) {
	loc := c.location()
	y, m, d := time.UnixMicro(us).In(loc).Date()
	y, m, d = c.first(y, m, d)
	for range 4 {
		start = midnight(y, m, d, loc)
		ny, nm, nd := c.next(y, m, d)
		end = midnight(ny, nm, nd, loc)
		switch {
		case us < start:
			y, m, d = c.first(time.Date(y, m, d-1, 12, 0, 0, 0, time.UTC).Date())
		case us >= end:
			y, m, d = ny, nm, nd
		default:
			return start, end
		}
	}
	return min(start, us), max(end, us+1) // not reached for any real zone
}

// first is the local date that begins the window holding date y-m-d.
func (c Calendar) first(y int, m time.Month, d int) (int, time.Month, int) {
	switch c.Period {
	case Week:
		// Monday is day 0 of an ISO week.
		wd := (int(time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday()) + 6) % 7
		t := time.Date(y, m, d-wd, 12, 0, 0, 0, time.UTC)
		return t.Date()
	case Month:
		return y, m, 1
	}
	return y, m, d
}

// next is the local date that begins the window after the one that date
// y-m-d (a first date) begins.
func (c Calendar) next(y int, m time.Month, d int) (int, time.Month, int) {
	var t time.Time
	switch c.Period {
	case Week:
		t = time.Date(y, m, d+7, 12, 0, 0, 0, time.UTC)
	case Month:
		t = time.Date(y, m+1, 1, 12, 0, 0, 0, time.UTC)
	default:
		t = time.Date(y, m, d+1, 12, 0, 0, 0, time.UTC)
	}
	return t.Date()
}

// midnight is the first instant (µs) of local date y-m-d in loc: its
// midnight, or where a daylight saving change skips midnight (Santiago,
// Havana, Beirut spring forward at 00:00), the end of the gap, as the
// local clock then reads 01:00 on that date. time.Date would pick an
// instant before the gap, still on the day before.
func midnight(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if ty, tm, td := t.Date(); ty != y || tm != m || td != d {
		if _, end := t.ZoneBounds(); !end.IsZero() {
			t = end
		}
	}
	return t.UnixMicro()
}

// longest is a bound on the length of c's windows, in µs, for the checks
// that keep arithmetic exact: a month of 31 days with an hour's shift, and
// a day more for any zone that moved its date line.
func (c Calendar) longest() int64 {
	days := int64(2)
	switch c.Period {
	case Week:
		days = 8
	case Month:
		days = 32
	}
	return days * 24 * time.Hour.Microseconds()
}

// CalendarWindows is a compiled Calendar (Compiled.Windows): the window
// the clock is in, remembered, so a decision inside it does no time zone arithmetic (an
// atomic load and two comparisons, where the window algorithms' plain
// windows divide). It is shared by every goroutine deciding for one
// store; a decision in another window computes that one and remembers it.
type CalendarWindows struct {
	cal Calendar
	cur atomic.Pointer[CalendarWindow]
}

// CalendarWindow is one calendar window [Start, End) in µs, with the
// starts of the windows before and after it (Prev, Next), and the four
// boxed once in Args for the Redis script's arguments (see
// limiter/redisstore), so that a decision boxes none.
type CalendarWindow struct {
	Prev, Start, End, Next int64
	Args                   [4]any
}

func newCalendarWindows(c Calendar) *CalendarWindows {
	return &CalendarWindows{cal: c}
}

// Around is the window us falls in, with its neighbours.
func (cw *CalendarWindows) Around(us int64) *CalendarWindow {
	if w := cw.cur.Load(); w != nil && us >= w.Start && us < w.End {
		return w
	}
	start, end := cw.cal.bounds(us)
	prev, _ := cw.cal.bounds(start - 1)
	_, next := cw.cal.bounds(end)
	w := &CalendarWindow{Prev: prev, Start: start, End: end, Next: next}
	w.Args = [4]any{prev, start, end, next}
	// Remember the latest window seen: a clock stepped back (only a test's)
	// must not pin an old one.
	if old := cw.cur.Load(); old == nil || start >= old.Start {
		cw.cur.Store(w)
	}
	return w
}

// At is the window us falls in, [start, end) in µs.
func (cw *CalendarWindows) At(us int64) (start, end int64) {
	w := cw.Around(us)
	return w.Start, w.End
}

// endOf is the end of the window that begins at start.
func (cw *CalendarWindows) endOf(start int64) int64 {
	if w := cw.cur.Load(); w != nil {
		switch start {
		case w.Start:
			return w.End
		case w.Prev:
			return w.Start
		case w.End:
			return w.Next
		}
	}
	_, end := cw.cal.bounds(start)
	return end
}

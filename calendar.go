package ratelimit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // calendar zones' time zones on hosts without a zoneinfo database

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// calendar is the limiter's Calendar the config describes; validate has
// refused any it cannot describe, for which it is nil.
func (c *CalendarConfig) calendar() *limiter.Calendar {
	if c == nil {
		return nil
	}
	loc, err := loadTimeZone(c.TimeZone)
	if err != nil {
		return nil
	}
	return &limiter.Calendar{Period: limiter.Period(c.Period), Location: loc}
}

// validate refuses a period or a time zone the limiter cannot use.
func (c *CalendarConfig) validate() error {
	if err := validPeriod(c.Period); err != nil {
		return err
	}
	if _, err := loadTimeZone(c.TimeZone); err != nil {
		return err
	}
	return nil
}

// validPeriod refuses anything but day, week and month.
func validPeriod(p string) error {
	return limiter.Calendar{Period: limiter.Period(p)}.Validate()
}

// timeZones remembers the time zones loaded, by name: a config names a
// few, and validation and provisioning each ask for them.
var timeZones sync.Map // name → *time.Location

// loadTimeZone loads a time zone by its IANA name ("" is UTC). The
// database is compiled in (time/tzdata), so every instance resolves a name
// alike whatever its host has; "Local", which is each host's own, is
// refused, since instances sharing a limit must agree on its windows.
func loadTimeZone(name string) (*time.Location, error) {
	if name == "Local" {
		return nil, errors.New(`time zone "Local" is each host's own: name an IANA time zone such as Europe/Berlin, or leave it out for UTC`)
	}
	if loc, ok := timeZones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q: want an IANA name such as Europe/Berlin or America/New_York", name)
	}
	timeZones.Store(name, loc)
	return loc, nil
}

// calendarPolicy is what RateLimit-Policy says of a calendar limit, whose
// window (w=) is the current calendar window's length: 23 hours on the
// day clocks spring forward. The item of the window last reported is
// remembered, so a request within it costs a load and two comparisons.
type calendarPolicy struct {
	name   string
	policy limiter.Policy
	cur    atomic.Pointer[calendarItem]
}

// calendarItem is a limit's RateLimit-Policy member for the calendar window
// [start, end), Unix µs, and the window's length in whole seconds, the w
// of every family's policy.
type calendarItem struct {
	start, end int64
	item       string
	window     int64
}

// current is the item of the window a decision made at t falls in.
func (c *calendarPolicy) current(t time.Time) *calendarItem {
	us := t.UnixMicro()
	if it := c.cur.Load(); it != nil && us >= it.start && us < it.end {
		return it
	}
	start, end := c.policy.Calendar.Window(t)
	_, w := c.policy.QuotaAt(t)
	it := &calendarItem{start: start.UnixMicro(), end: end.UnixMicro(), item: policyItemAt(c.name, c.policy, t), window: max(1, ceilSeconds(w))}
	c.cur.Store(it)
	return it
}

// windowAt is the window RateLimit-Policy reports for l at t: the one
// made once, or for a calendar limit the length of the calendar window t
// falls in (now, for the zero t of a decision no store timed).
func (l *limit) windowAt(t time.Time) time.Duration {
	if l.calendar == nil {
		return l.window
	}
	if t.IsZero() {
		t = time.Now()
	}
	_, w := l.policy.QuotaAt(t)
	return w
}

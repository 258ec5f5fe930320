package testutil

import (
	"sync/atomic"
	"time"
)

// Clock is a clock tests set by hand. It satisfies limiter.Clock, the one
// way time is injected in this module, and is safe to read from many
// goroutines while one of them moves it.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock showing t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now is the time the clock shows.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// SetMicro moves the clock to us microseconds after the Unix epoch, the
// unit the algorithm case table uses.
func (c *Clock) SetMicro(us int64) { c.ns.Store(us * int64(time.Microsecond)) }

// Advance moves the clock d forwards (backwards for a negative d).
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

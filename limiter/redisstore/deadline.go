package redisstore

import (
	"context"
	"sync/atomic"
	"time"
)

// deadlineTicks is how many ticks a store's timeout spans. A decision's
// deadline is rounded up to the next tick, so it may end up to timeout/8
// late; in exchange every decision ending in the same tick shares one timer.
const deadlineTicks = 8

// deadlineCells is the size of the ring of pending ticks: well above the
// deadlineTicks+1 ticks that can be pending at once.
const deadlineCells = 32

// deadlines bounds the Redis store's decisions without a timer each.
// context.WithTimeout starts and stops a runtime timer per call, which at
// tens of thousands of decisions a second costs about a microsecond of CPU
// per decision. Here decisions whose deadlines fall in the same tick share
// one channel, closed by one timer when the tick ends.
type deadlines struct {
	base  time.Time // carries a monotonic reading: ticks ignore wall-clock steps
	tick  time.Duration
	cells [deadlineCells]atomic.Pointer[deadlineTick]
}

// deadlineTick is one tick's channel, closed when the tick ends.
type deadlineTick struct {
	n    int64 // ticks since base
	done chan struct{}
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{base: time.Now(), tick: max(timeout/deadlineTicks, time.Microsecond)}
}

// after returns the end of the tick in which timeout from now falls, and a
// channel closed then.
func (d *deadlines) after(timeout time.Duration) (time.Time, <-chan struct{}) {
	since := time.Since(d.base)
	n := int64((since + timeout + d.tick - 1) / d.tick)
	at := d.base.Add(time.Duration(n) * d.tick)
	cell := &d.cells[n%deadlineCells]
	for {
		t := cell.Load()
		if t != nil && t.n == n {
			return at, t.done
		}
		fresh := &deadlineTick{n: n, done: make(chan struct{})}
		if t != nil && t.n > n {
			// The cell has moved on to a later tick: this caller was
			// descheduled for a whole ring. Give it a timer of its own.
			fresh.closeAt(at)
			return at, fresh.done
		}
		if cell.CompareAndSwap(t, fresh) {
			fresh.closeAt(at)
			return at, fresh.done
		}
	}
}

func (t *deadlineTick) closeAt(at time.Time) {
	time.AfterFunc(time.Until(at), func() { close(t.done) })
}

// decisionContext is the context of one Redis decision: the caller's values,
// a deadline from deadlines, and a Done that closes at that deadline. It
// does not follow the caller's cancellation: a decision is short (the
// store's timeout) and a client that went away still took its units.
type decisionContext struct {
	context.Context
	deadline time.Time
	done     <-chan struct{}
}

// bound is ctx bounded by timeout from now, give or take a tick. A caller
// whose own deadline comes sooner keeps its context as it is.
func (d *deadlines) bound(ctx context.Context, timeout time.Duration) context.Context {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		return ctx
	}
	at, done := d.after(timeout)
	return decisionContext{Context: ctx, deadline: at, done: done}
}

func (c decisionContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c decisionContext) Done() <-chan struct{} { return c.done }

func (c decisionContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

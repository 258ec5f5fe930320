package limiter

import (
	"context"
	"time"
)

// Store keeps the state of every key under one Policy and decides for it.
// Implementations are safe for concurrent use.
type Store interface {
	// Take decides whether cost units for key may pass now and, if so,
	// consumes them. An error means no decision was made; the caller's
	// fail mode applies.
	Take(ctx context.Context, key string, cost int64) (Decision, error)
	// Refund gives back the units an allowed Take consumed: when another
	// zone denied the same request, or, for an algorithm whose Traits say
	// ReleasesOnFinish, when the response is finished. It returns the
	// key's state afterwards. Every give-back, whatever its cause, is a
	// Refund.
	Refund(ctx context.Context, key string, cost int64, taken Decision) (Decision, error)
}

// Clock tells the time. It is the one way time is injected in this module:
// stores, the breaker, the JWT verifier and the handler each take one in
// their options, nil meaning the system clock, so tests step time exactly.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

// Now calls f.
func (f ClockFunc) Now() time.Time { return f() }

// SystemClock is the wall clock.
var SystemClock Clock = ClockFunc(time.Now)

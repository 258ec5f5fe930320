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
	// Peek reports key's state as a refund of nothing would: Remaining
	// and ResetAfter as they stand, consuming nothing, so an operator
	// can see why a client is refused.
	Peek(ctx context.Context, key string) (Decision, error)
	// Reset forgets key's state: its next request starts afresh, as
	// after an operator clears a key for a support ticket. It reports
	// whether there was any state to forget (a key whose state is back
	// to empty has none).
	Reset(ctx context.Context, key string) (existed bool, err error)
}

// Leaser is a shared store that can grant several units in one decision,
// so a NearCache in front of it can spend them without asking again. The
// algorithms whose Traits say Leases implement it.
type Leaser interface {
	Store
	// TakeUpTo decides like Take, but an admission takes as many units
	// as the limit has left, up to want (>= cost), and Granted reports
	// how many. Refund gives back any part of them, naming the
	// admission's Decision.
	TakeUpTo(ctx context.Context, key string, cost, want int64) (Decision, error)
	// Renew gives back unspent units of an earlier admission of back.Key,
	// then takes up to want as TakeUpTo does, in one atomic call: a lease
	// that lapsed with units left is returned by the call that replaces
	// it, so the next lease can use them and the give-back costs no round
	// trip of its own. An error means neither happened, or both: the
	// caller cannot tell, and must not give the units back again.
	Renew(ctx context.Context, back Refund, cost, want int64) (Decision, error)
	// RefundMany does each refund as Refund would, in as few calls to the
	// shared store as it allows, since lapsed leases are given back many
	// at a time. It reports the refunds that failed, which may or may not
	// have been done.
	RefundMany(ctx context.Context, refunds []Refund) error
}

// Charger is a store that can take units past its limit. A request whose
// real cost is known only after its response (the tokens an upstream
// reports using) was admitted on an estimate; the rest of its cost has
// been spent already and must be counted even when the limit no longer
// has it, or a client could spend any amount behind a small estimate. The
// algorithms whose Traits say Charges implement it.
type Charger interface {
	// Charge takes cost more units of key now, whether or not the limit
	// has them: the key then owes, and its requests are refused until
	// time repays the debt. It returns the key's state afterwards
	// (Remaining 0 while in debt; Granted, the units charged). A key owes
	// at most one quota (Policy.MaxCost) beyond its limit, so the debt
	// stays bounded and its arithmetic exact: the part of a charge beyond
	// that is forgiven, and Granted is less than cost. cost is from 1 to
	// MaxCost. An error means nothing was charged, except through a
	// NearCache, where the part its lease paid was.
	Charge(ctx context.Context, key string, cost int64) (Decision, error)
}

// Refund is one give-back of RefundMany or Renew: Cost units of Key that the
// admission Taken consumed.
type Refund struct {
	Key   string
	Cost  int64
	Taken Decision
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

package limiter

import (
	"context"
	"time"
)

// Store keeps the state of every key under one Policy and decides for it.
// Implementations are safe for concurrent use.
type Store interface {
	// Take decides whether cost units for key may pass now and, if so,
	// consumes them: the Admission reports the decision and is the only
	// way the units come back. An error means no decision was made; the
	// caller's fail mode applies.
	Take(ctx context.Context, key string, cost int64) (Admission, error)
	// GiveBack returns units of an admission of key, named by its
	// receipt, and returns the key's state afterwards. Admission calls
	// it, which checks that no unit comes back twice; nothing else does.
	GiveBack(ctx context.Context, key string, units int64, taken Receipt) (Decision, error)
	// Peek reports key's state as a give-back of nothing would: Remaining
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
// so a nearcache.Cache in front of it can spend them without asking again. The
// algorithms whose Traits say Leases implement it.
type Leaser interface {
	Store
	// TakeUpTo decides like Take, but an admission takes as many units
	// as the limit has left, up to want (>= cost): a lease, whose Granted
	// says how many and which holds them all.
	TakeUpTo(ctx context.Context, key string, cost, want int64) (Admission, error)
	// Renew returns unspent units of an earlier lease of back.Key, then
	// takes up to want as TakeUpTo does, in one atomic call: a lease
	// that lapsed with units left is returned by the call that replaces
	// it, so the next lease can use them and the return costs no round
	// trip of its own. An error means neither happened, or both: the
	// caller cannot tell, and must not return the units again.
	Renew(ctx context.Context, back Return, cost, want int64) (Admission, error)
	// ReturnMany does each return as GiveBack would, in as few calls to
	// the shared store as it allows, since lapsed leases are returned
	// many at a time. It reports the returns that failed, which may or
	// may not have been done.
	ReturnMany(ctx context.Context, returns []Return) error
}

// LeaseBatcher is a Leaser that can take the leases of several keys in
// one call to the shared store. A nearcache.Cache whose store is one
// commits its lease requests in groups: a request that finds another
// under way on its lane waits for it, and those that waited go together
// in the next call (docs/design.md, "The near cache").
type LeaseBatcher interface {
	Leaser
	// LeaseLane names the calls a lease of key may share: the leases of
	// keys of one lane may go to LeaseMany together and then cost one
	// call; a call of one lane does not hold up another's. A negative
	// lane shares no call: such a key's leases go alone (TakeUpTo,
	// Renew), as on a Redis Cluster, where every key has a hash slot of
	// its own and a script may touch one.
	LeaseLane(key string) int
	// LeaseMany does each of asks as TakeUpTo would (Renew, for an ask
	// that gives units back first), in order, in as few calls as the
	// store allows, and answers each in its place: answers[i] is asks[i]'s,
	// an admission or an error. An error of one ask fails that ask alone;
	// one of a call fails every ask the call carried, each of which may
	// or may not have been done, as an error of TakeUpTo or Renew means.
	LeaseMany(ctx context.Context, asks []LeaseAsk) []LeaseAnswer
}

// LeaseAsk is one lease for LeaseMany: up to Want units of Key for a
// request of Cost, as TakeUpTo takes them; when Back.Units is positive,
// Back (of the same key) is given back first, in the same call, as Renew
// gives it.
type LeaseAsk struct {
	Key        string
	Cost, Want int64
	Back       Return
}

// LeaseAnswer is the answer to one LeaseAsk: what TakeUpTo or Renew would
// have returned.
type LeaseAnswer struct {
	Admission
	Err error
}

// LeaseLifetime is the longest a lease is spent from: its unspent units
// then go back to the shared store, so quota is stranded on one instance
// for at most this long.
const LeaseLifetime = time.Second

// Charger is a store that can take units past its limit. A request whose
// real cost is known only after its response (the tokens an upstream
// reports using) was admitted on an estimate; the rest of its cost has
// been spent already and must be counted even when the limit no longer
// has it, or a client could spend any amount behind a small estimate. The
// algorithms whose Traits say Charges implement it.
type Charger interface {
	// Charge takes cost more units of key now, whether or not the limit
	// has them: the key then owes, and its requests are refused until
	// time repays the debt. It reports the key's state afterwards
	// (Remaining 0 while in debt; Granted, the units charged), and holds
	// nothing: charged units never come back. A key owes at most one
	// quota (Policy.MaxCost) beyond its limit, so the debt stays bounded
	// and its arithmetic exact: the part of a charge beyond that is
	// forgiven, and Granted is less than cost. cost is from 1 to MaxCost.
	// An error means nothing was charged, except through a nearcache.Cache,
	// where the part its lease paid was.
	Charge(ctx context.Context, key string, cost int64) (Admission, error)
}

// Return is one return of unspent lease units, for ReturnMany or Renew:
// Units of Key that the lease named by Taken holds.
type Return struct {
	Key   string
	Units int64
	Taken Receipt
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

package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admission is what a store answers to Take: the Decision (a report), and
// when the request was admitted, what it holds of the store and the
// store's receipt for it. Units come back only through it: a refund when
// another zone refused the request or its response did not count, a
// release when a concurrency request finishes, a charge when the response
// reports a higher cost. Like x/time/rate's Reservation it knows the store
// and the state name that took the units, so they go back to that state
// whatever has changed since (an override, a reload, a fail-local
// fallback), and it refuses to give back more than it holds, or twice.
//
// An Admission is a value: the caller keeps it in one place (a request's
// record) and calls its methods through a pointer, which is not safe for
// concurrent use.
type Admission struct {
	Decision
	// Receipt is the store's name for what the admission took; only the
	// store that made it reads it.
	Receipt Receipt
	store   Store
	// key is the state name the units were taken from.
	key string
	// held is how many of the units taken may still be given back.
	held int64
}

// Receipt is a store's record of one admission: what it needs to give its
// units back into the window, log entry, lease or slot that counted them,
// however long after.
type Receipt struct {
	// At is the store's time of the admission, µs.
	At int64
	// Mark names the admission in the store when At does not: the time a
	// sliding log entry is logged at, for units spent from a lease the
	// lease's grant.
	Mark int64
	// Epoch names the state of the key that took the units, among every
	// state the store has made for the key: a reset (or a sweep, or an
	// eviction) ends a state, and the key's next take makes a new one
	// with a new epoch. A give-back is credited only to the state its
	// epoch names; one to a later state is dropped, since that state never
	// counted its units (docs/design.md, "Exact where features meet").
	// Zero names no state: a give-back of a receipt a store did not make
	// (the regional store's, to its global store) goes to the key's
	// current state.
	Epoch uint64
	// Slot numbers the concurrency slot a Redis admission holds among its
	// store's, which name it with their own random part (so a receipt
	// stays 8 bytes of it, and an Admission 128); zero for none.
	Slot uint64
	// Lease numbers the nearcache.Cache lease the units were spent from; zero
	// for any other admission.
	Lease uint64
	// Granted is how many units the admission took: its cost, for a lease
	// (Leaser.TakeUpTo) what it was granted, for a charge what was
	// charged. Only the algorithms that lease or charge set it.
	Granted int64
}

// Name is the admission's name in the store: Mark, else At.
func (r Receipt) Name() int64 {
	if r.Mark != 0 {
		return r.Mark
	}
	return r.At
}

// NewAdmission is how a store outside this package answers an admission:
// s took held units of key, and gives them back by receipt r.
func NewAdmission(s Store, key string, held int64, d Decision, r Receipt) Admission {
	return Admission{Decision: d, Receipt: r, store: s, key: key, held: held}
}

// taken is what an algorithm's take or charge answers the memory store,
// which makes the Admission of it (Memory.admission). It is four words so
// that it comes back through the store's layers (the algorithm, the
// shard set, the interface's wrapper) in registers: an Admission is 128
// bytes, and one written field by field and then copied stalls on each
// 16 bytes until the writes land, while each layer it passes through
// zeroes and copies it again; together about a sixth of a decision.
type taken struct {
	// units is how many units were taken (a lease's grant, the units a
	// charge took), or -1 for a refusal.
	units int64
	// remaining, reset and wait are the Decision's Remaining, ResetAfter
	// and RetryAfter.
	remaining   int64
	reset, wait time.Duration
}

// refused is the taken of a refusal.
func refused(remaining int64, reset, wait time.Duration) taken {
	return taken{units: -1, remaining: remaining, reset: reset, wait: wait}
}

// epochs is where the memory store keeps the epoch of a key's state
// (cell.epoch) and its shard's count of states made (shard.epochs), which
// an algorithm's take or charge updates through it (judge).
type epochs struct {
	cell, shard *uint64
}

// judge starts a new state (Receipt.Epoch) when the algorithm found the
// key's state holding nothing (empty). An empty state is no state: a
// Redis script finds no key then (deleted once emptied, or expired), and
// the state the take makes is another, to which no give-back of units
// the earlier one counted is credited (a token bucket full again would
// otherwise take back units time has already repaid). Each algorithm
// judges emptiness from what its take computes anyway, so the check costs
// a branch. The shard is locked.
func (e epochs) judge(empty bool) {
	if empty {
		*e.shard++
		*e.cell = *e.shard
	}
}

// Errors of giving back.
var (
	// ErrNothingHeld: the admission holds no units (it was a refusal, or
	// its units came back already).
	ErrNothingHeld = errors.New("the admission holds no units")
	// ErrMoreThanHeld: more units than the admission still holds.
	ErrMoreThanHeld = errors.New("more units than the admission holds")
)

// Held is how many units may still be given back.
func (a *Admission) Held() int64 { return a.held }

// Granted is Receipt.Granted: the units a lease or charge took.
func (a *Admission) Granted() int64 { return a.Receipt.Granted }

// GiveBack returns units of the admission to the state that took them and
// reports that state afterwards. It refuses more than the admission still
// holds, so no unit comes back twice.
func (a *Admission) GiveBack(ctx context.Context, units int64) (Decision, error) {
	switch {
	case units <= 0:
		return Decision{}, fmt.Errorf("giving back %d units", units)
	case a.held == 0:
		return Decision{}, ErrNothingHeld
	case units > a.held:
		return Decision{}, fmt.Errorf("giving back %d units of %d: %w", units, a.held, ErrMoreThanHeld)
	}
	a.held -= units
	return a.store.GiveBack(ctx, a.key, units, a.Receipt)
}

// Release gives back every unit still held: a concurrency slot when its
// request finishes, or all a request took when another zone refused it.
// An admission that holds nothing is left as it is.
func (a *Admission) Release(ctx context.Context) (Decision, error) {
	if a.held == 0 {
		return Decision{}, ErrNothingHeld
	}
	return a.GiveBack(ctx, a.held)
}

// Charge takes units more of the state that admitted, past its limit if
// need be (see Charger): a cost the response reports above what was taken
// up front. The units are spent, not held: they never come back.
func (a *Admission) Charge(ctx context.Context, units int64) (Decision, error) {
	if a.store == nil {
		return Decision{}, errors.New("charging a refused request")
	}
	c, ok := a.store.(Charger)
	if !ok {
		return Decision{}, errors.New("the store cannot charge past its limit")
	}
	ch, err := c.Charge(ctx, a.key, units)
	return ch.Decision, err
}

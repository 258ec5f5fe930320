package limiter

import "sync/atomic"

// concurrencyState counts a key's units in flight.
type concurrencyState struct {
	inFlight int64
	// epoch names this state among every state the store ever made for
	// any key: the admissions it counts carry it (Receipt.Mark), and a
	// release is subtracted only from the state that counted it. A key
	// that was reset (or evicted) while requests ran starts a new state,
	// and their releases, arriving later, must not free slots that the
	// new state's requests hold (as a Redis slot, named by its id, is
	// never removed twice).
	epoch int64
}

// concurrencyEpochs hands out concurrencyState.epoch.
var concurrencyEpochs atomic.Int64

// take: allow iff in flight + c <= L; remaining = L - in flight. There is
// no time to wait for: a slot frees when a response finishes, so reset and
// retry_after are zero.
func (s *concurrencyState) take(p *params, now, cost, _ int64, by taker) (a Admission) {
	a.Time, a.Receipt.At = now, now
	if s.inFlight+cost > p.l {
		a.Remaining = max(0, p.l-s.inFlight)
		return a
	}
	if s.epoch == 0 {
		s.epoch = concurrencyEpochs.Add(1)
	}
	s.inFlight += cost
	a.Allowed, a.Remaining = true, p.l-s.inFlight
	a.Receipt.Mark = s.epoch
	a.store, a.key, a.held = by.store, by.key, cost
	return a
}

// charge refuses: a slot is a request in flight, so a concurrency state
// cannot owe (Traits.Charges is false and Memory.Charge never asks).
func (s *concurrencyState) charge(_ *params, now, _ int64) Admission {
	return Admission{Decision: Decision{Time: now}}
}

func (s *concurrencyState) refund(p *params, now, cost, name int64) Decision {
	if name == s.epoch {
		s.inFlight = max(0, s.inFlight-cost)
	}
	return Decision{Allowed: true, Remaining: max(0, p.l-s.inFlight)}
}

func (s *concurrencyState) idle(*params, int64) bool {
	return s.inFlight == 0
}

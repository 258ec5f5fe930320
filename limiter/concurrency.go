package limiter

// concurrencyState counts a key's units in flight. A key that was reset
// (or evicted) while requests ran starts a new state, and their releases,
// arriving later, must not free slots that the new state's requests hold
// (as a Redis slot, named by its id, is never removed twice): the state's
// epoch, which every store's state has (cell.epoch), sees to that.
type concurrencyState struct {
	inFlight int64
}

// take: allow iff in flight + c <= L; remaining = L - in flight. There is
// no time to wait for: a slot frees when a response finishes, so reset and
// retry_after are zero.
func (s *concurrencyState) take(p *params, now, cost, _ int64, by taker) (a Admission) {
	epoch := by.stateEpoch(s.inFlight == 0)
	a.Time, a.Receipt.At = now, now
	if s.inFlight+cost > p.l {
		a.Remaining = max(0, p.l-s.inFlight)
		return a
	}
	s.inFlight += cost
	a.Allowed, a.Remaining = true, p.l-s.inFlight
	a.store, a.key, a.held, a.Receipt.Epoch = by.store, by.key, cost, epoch
	return a
}

// charge refuses: a slot is a request in flight, so a concurrency state
// cannot owe (Traits.Charges is false and Memory.Charge never asks).
func (s *concurrencyState) charge(_ *params, now, _ int64, _ taker) Admission {
	return Admission{Decision: Decision{Time: now}}
}

func (s *concurrencyState) refund(p *params, _, cost, _ int64) Decision {
	s.inFlight = max(0, s.inFlight-cost)
	return Decision{Allowed: true, Remaining: max(0, p.l-s.inFlight)}
}

func (s *concurrencyState) idle(*params, int64) bool {
	return s.inFlight == 0
}

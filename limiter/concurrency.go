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
func (s *concurrencyState) take(p *params, now, cost, _ int64, e epochs) (taken, int64, int64) {
	e.judge(s.inFlight == 0)
	if s.inFlight+cost > p.l {
		return refused(max(0, p.l-s.inFlight), 0, 0), now, 0
	}
	s.inFlight += cost
	return taken{units: cost, remaining: p.l - s.inFlight}, now, 0
}

// charge refuses: a slot is a request in flight, so a concurrency state
// cannot owe (Traits.Charges is false and Memory.Charge never asks).
func (s *concurrencyState) charge(_ *params, now, _ int64, _ epochs) (taken, int64, int64) {
	return refused(0, 0, 0), now, 0
}

func (s *concurrencyState) refund(p *params, _, cost, _ int64) Decision {
	s.inFlight = max(0, s.inFlight-cost)
	return Decision{Allowed: true, Remaining: max(0, p.l-s.inFlight)}
}

func (s *concurrencyState) idle(*params, int64) bool {
	return s.inFlight == 0
}

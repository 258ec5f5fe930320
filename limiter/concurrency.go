package limiter

// concurrencyState counts a key's units in flight.
type concurrencyState struct {
	inFlight int64
}

// take: allow iff in flight + c <= L; remaining = L - in flight. There is
// no time to wait for: a slot frees when a response finishes, so reset and
// retry_after are zero.
func (s *concurrencyState) take(p *params, now, cost int64) Decision {
	if s.inFlight+cost > p.l {
		return Decision{Remaining: max(0, p.l-s.inFlight), at: now}
	}
	s.inFlight += cost
	return Decision{Allowed: true, Remaining: p.l - s.inFlight, at: now}
}

func (s *concurrencyState) refund(p *params, now, cost int64, _ Decision) Decision {
	s.inFlight = max(0, s.inFlight-cost)
	return Decision{Allowed: true, Remaining: p.l - s.inFlight}
}

func (s *concurrencyState) idle(*params, int64) bool {
	return s.inFlight == 0
}

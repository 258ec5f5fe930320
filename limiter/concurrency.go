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
func (s *concurrencyState) take(p *params, now, cost int64) Admission {
	if s.inFlight+cost > p.l {
		return Admission{Decision: Decision{Remaining: max(0, p.l-s.inFlight), Time: now}}
	}
	if s.epoch == 0 {
		s.epoch = concurrencyEpochs.Add(1)
	}
	s.inFlight += cost
	return Admission{Decision: Decision{Allowed: true, Remaining: p.l - s.inFlight, Time: now}, Receipt: Receipt{Mark: s.epoch}}
}

func (s *concurrencyState) refund(p *params, now, cost int64, taken Receipt) Decision {
	if taken.Mark == s.epoch {
		s.inFlight = max(0, s.inFlight-cost)
	}
	return Decision{Allowed: true, Remaining: max(0, p.l-s.inFlight)}
}

func (s *concurrencyState) idle(*params, int64) bool {
	return s.inFlight == 0
}

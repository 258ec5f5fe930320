package limiter

// bucketState is the state shared by TokenBucket and LeakyBucket: the
// theoretical arrival time (tat) of the bucket, the moment at which it would
// be empty of queued work (leaky) or full of tokens again (token). It is kept
// as whole microseconds plus a remainder in units of 1/L µs, so time scaled
// by L is exact and one unit of work costs exactly W.
type bucketState struct {
	tatUs   int64
	tatFrac int64 // in [0, L)
}

// debt is how far tat lies ahead of now, in µs scaled by L: for a token
// bucket B×W minus the tokens×W it holds, for a leaky bucket the queued wait.
func (s *bucketState) debt(p *params, now int64) int64 {
	d := s.tatUs - now
	if d < 0 {
		return 0
	}
	// Bound d before scaling so a clock stepped backwards cannot overflow.
	if d > p.maxAhead {
		d = p.maxAhead
	}
	return d*p.l + s.tatFrac
}

// setDebt moves tat to now + debt/L.
func (s *bucketState) setDebt(p *params, now, debt int64) {
	if debt <= 0 {
		s.tatUs, s.tatFrac = now, 0
		return
	}
	s.tatUs = now + debt/p.l
	s.tatFrac = debt % p.l
}

func (s *bucketState) take(p *params, now, cost int64) Decision {
	if p.alg == LeakyBucket {
		return s.takeLeaky(p, now, cost)
	}
	return s.takeToken(p, now, cost)
}

func (s *bucketState) undo(p *params, now, cost int64, _ Decision) Decision {
	debt := s.debt(p, now) - cost*p.w
	s.setDebt(p, now, debt)
	return s.status(p, now)
}

// status is the key's state as a Decision with nothing taken.
func (s *bucketState) status(p *params, now int64) Decision {
	debt := s.debt(p, now)
	if p.alg == LeakyBucket {
		return Decision{Allowed: true, Remaining: leakyRemaining(p, debt), ResetAfter: microseconds(ceilDiv(debt, p.l))}
	}
	return Decision{Allowed: true, Remaining: (p.b*p.w - debt) / p.w, ResetAfter: microseconds(ceilDiv(debt, p.l))}
}

func (s *bucketState) idle(p *params, now int64) bool {
	return s.debt(p, now) == 0
}

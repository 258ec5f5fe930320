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

// refund gives cost units back: tat moves back by c/r, never before now.
func (s *bucketState) refund(p *params, now, cost int64) int64 {
	debt := s.debt(p, now) - cost*p.w
	s.setDebt(p, now, debt)
	return s.debt(p, now)
}

func (s *bucketState) idle(p *params, now int64) bool {
	return s.debt(p, now) == 0
}

package limiter

// leakyBucketState is a leaky bucket's state.
type leakyBucketState struct{ bucketState }

// take is the leaky bucket (docs/design.md), by virtual
// scheduling: the request would start at max(tat, now), so it waits
// tat - now. A wait beyond max_delay means the queue is full. Otherwise tat
// advances by c/r and the caller holds the request for the wait.
//
// In time scaled by L (one unit costs W): wait = debt; allow iff
// wait <= maxDelay; then debt += c×W.
func (s *leakyBucketState) take(p *params, now, cost int64) Admission {
	wait := s.debt(p, now)
	if wait > p.maxDelay {
		return Admission{Decision: Decision{
			ResetAfter: microseconds(ceilDiv(wait, p.l)),
			RetryAfter: microseconds(ceilDiv(wait-p.maxDelay, p.l)),
			Time:       now,
		}}
	}
	debt := wait + cost*p.w
	s.setDebt(p, now, debt)
	return Admission{Decision: Decision{
		Allowed:    true,
		Remaining:  leakyRemaining(p, debt),
		ResetAfter: microseconds(ceilDiv(debt, p.l)),
		RetryAfter: microseconds(ceilDiv(wait, p.l)),
		Time:       now,
	}}
}

func (s *leakyBucketState) refund(p *params, now, cost int64, _ Receipt) Decision {
	debt := s.bucketState.refund(p, now, cost)
	return Decision{Allowed: true, Remaining: leakyRemaining(p, debt), ResetAfter: microseconds(ceilDiv(debt, p.l))}
}

// leakyRemaining is the free queue places for unit requests:
// ⌊(max_delay - (tat - now))×r⌋ + 1, or 0 once tat - now exceeds max_delay.
func leakyRemaining(p *params, debt int64) int64 {
	if debt > p.maxDelay {
		return 0
	}
	return (p.maxDelay-debt)/p.w + 1
}

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
func (s *leakyBucketState) take(p *params, now, cost, _ int64, e epochs) (taken, int64, int64) {
	wait := s.debt(p, now)
	e.judge(wait == 0)
	if wait > p.maxDelay {
		return refused(0, microseconds(ceilDiv(wait, p.l)), microseconds(ceilDiv(wait-p.maxDelay, p.l))), now, 0
	}
	debt := wait + cost*p.w
	s.setDebt(p, now, debt)
	return taken{units: cost, remaining: leakyRemaining(p, debt), reset: microseconds(ceilDiv(debt, p.l)), wait: microseconds(ceilDiv(wait, p.l))}, now, 0
}

// charge refuses: a leaky bucket's units are waits already served, so it
// cannot owe (Traits.Charges is false and Memory.Charge never asks).
func (s *leakyBucketState) charge(_ *params, now, _ int64, _ epochs) (taken, int64, int64) {
	return refused(0, 0, 0), now, 0
}

func (s *leakyBucketState) refund(p *params, now, cost, _ int64) Decision {
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

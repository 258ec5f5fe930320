package limiter

// tokenBucketState is a token bucket's state.
type tokenBucketState struct{ bucketState }

// take is the token bucket (docs/design.md):
// tokens = min(B, tokens + elapsed×r); allow iff tokens >= c.
//
// With debt = (B - tokens)×W, kept exact in time scaled by L:
// allow iff debt + c×W <= B×W; remaining = ⌊(B×W - debt)/W⌋;
// reset = debt/L µs; retry_after = (debt + c×W - B×W)/L µs.
//
// With want above cost it takes as many tokens as the bucket holds, up to
// want, when it holds at least cost: a lease.
func (s *tokenBucketState) take(p *params, now, cost, want int64, e epochs) (taken, int64, int64) {
	debt := s.debt(p, now)
	e.judge(debt == 0)
	full := p.b * p.w
	need := debt + cost*p.w
	if need > full {
		// Never negative: a clock behind the bucket's state reads a debt
		// beyond the burst (debt bounds it, see bucketState).
		return refused(max(0, (full-debt)/p.w), microseconds(ceilDiv(debt, p.l)), microseconds(ceilDiv(need-full, p.l))), now, 0
	}
	granted := cost // what fits, when no more is wanted: need <= full
	if want > cost {
		granted = min(want, (full-debt)/p.w)
		need = debt + granted*p.w
	}
	s.setDebt(p, now, need)
	return taken{units: granted, remaining: (full - need) / p.w, reset: microseconds(ceilDiv(need, p.l))}, now, 0
}

// charge takes cost tokens whether or not the bucket holds them: tokens go
// below zero, down to −B at most (debt ≤ 2×B×W: the bucket owes at most
// one burst, and the part of a charge beyond that is forgiven). Requests
// are refused until the refill has repaid the debt and brought their
// cost. debt⁺ = max(debt, min(debt + c×W, 2×B×W)); granted is the tokens
// charged, ⌈(debt⁺ − debt)/W⌉. The max keeps a debt a clock stepped back
// has already put beyond the cap (debt bounds it by maxAhead).
func (s *tokenBucketState) charge(p *params, now, cost int64, e epochs) (taken, int64, int64) {
	debt := s.debt(p, now)
	e.judge(debt == 0)
	full := p.b * p.w
	next := max(debt, min(debt+cost*p.w, 2*full))
	s.setDebt(p, now, next)
	return taken{units: ceilDiv(next-debt, p.w), remaining: max(0, (full-next)/p.w), reset: microseconds(ceilDiv(next, p.l))}, now, 0
}

func (s *tokenBucketState) refund(p *params, now, cost, _ int64) Decision {
	debt := s.bucketState.refund(p, now, cost)
	return Decision{Allowed: true, Remaining: max(0, (p.b*p.w-debt)/p.w), ResetAfter: microseconds(ceilDiv(debt, p.l))}
}

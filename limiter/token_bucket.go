package limiter

// takeToken is the token bucket of DESIGN.md section 4:
// tokens = min(B, tokens + elapsed×r); allow iff tokens >= c.
//
// With debt = (B - tokens)×W, kept exact in time scaled by L:
// allow iff debt + c×W <= B×W; remaining = ⌊(B×W - debt)/W⌋;
// reset = debt/L µs; retry_after = (debt + c×W - B×W)/L µs.
func (s *bucketState) takeToken(p *params, now, cost int64) Decision {
	debt := s.debt(p, now)
	full := p.b * p.w
	need := debt + cost*p.w
	if need > full {
		return Decision{
			Remaining:  (full - debt) / p.w,
			ResetAfter: microseconds(ceilDiv(debt, p.l)),
			RetryAfter: microseconds(ceilDiv(need-full, p.l)),
			at:         now,
		}
	}
	s.setDebt(p, now, need)
	return Decision{
		Allowed:    true,
		Remaining:  (full - need) / p.w,
		ResetAfter: microseconds(ceilDiv(need, p.l)),
		at:         now,
	}
}

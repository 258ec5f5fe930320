package limiter

import "time"

// slidingCounterState holds the counts of window win and the one before it.
type slidingCounterState struct {
	win  int64
	prev int64
	cur  int64
}

// roll moves the counts on to now's window and returns the time to decide
// at, and whether the state held nothing at now (epochs.judge; never
// while the clock is behind, as in fixedWindowState.roll). As there, a now
// before the stored window (a clock read that lost the race for the lock)
// is taken as that window's start: rolling back would drop both counts and
// readmit a full quota.
func (s *slidingCounterState) roll(p *params, now int64) (int64, bool) {
	idx := windowIndex(p, now)
	switch {
	case idx < s.win:
		return s.win * p.w, false
	case idx == s.win:
	case idx == s.win+1:
		s.prev, s.cur = s.cur, 0
	default:
		s.prev, s.cur = 0, 0
	}
	s.win = idx
	return now, s.prev == 0 && s.cur == 0
}

// take: est = prev×(W - e)/W + cur where e is how far now is into its
// window; allow iff est + c <= L, decided exactly as
// prev×(W - e) + (cur + c)×W <= L×W.
//
// With want above cost it takes the most units that fit, up to want, when
// cost fits: a lease. The most g with prev×(W - e) + (cur + g)×W <= L×W.
func (s *slidingCounterState) take(p *params, now, cost, want int64, ep epochs) (taken, int64, int64) {
	now, empty := s.roll(p, now)
	ep.judge(empty)
	e := now - s.win*p.w
	if s.prev*(p.w-e)+(s.cur+cost)*p.w > p.l*p.w {
		remaining, reset := s.status(p, now)
		return refused(remaining, reset, microseconds(s.retryAfter(p, e, cost))), now, 0
	}
	granted := min(want, (p.l*p.w-s.prev*(p.w-e))/p.w-s.cur)
	s.cur += granted
	remaining, reset := s.status(p, now)
	return taken{units: granted, remaining: remaining, reset: reset}, now, 0
}

// retryAfter is the least x with est(now + x) + c <= L, nothing else
// arriving: first later in this window as prev's weight decays, else in the
// next window once cur (then prev) has decayed enough, else two windows on.
func (s *slidingCounterState) retryAfter(p *params, e, cost int64) int64 {
	rest := p.w - e
	// This window: prev×(W - e - x) <= (L - cur - c)×W.
	if slack := p.l - s.cur - cost; slack >= 0 && s.prev > 0 {
		if x := ceilDiv(s.prev*rest-slack*p.w, s.prev); x < rest {
			return x
		}
	}
	// Next window, at e' into it: cur×(W - e') <= (L - c)×W.
	if s.cur == 0 {
		return rest
	}
	if ep := ceilDiv((s.cur-p.l+cost)*p.w, s.cur); ep < p.w {
		return rest + ep
	}
	return rest + p.w
}

// charge takes cost units into the current window whether or not they
// fit: cur goes past L, up to 2L at most (the key owes at most one quota
// per window; the part of a charge beyond is forgiven, which also keeps
// every product the script forms within 4×L×W). Requests are refused
// until est has decayed: through this window's end, and in the next as
// the charged window's weight falls.
func (s *slidingCounterState) charge(p *params, now, cost int64, e epochs) (taken, int64, int64) {
	now, empty := s.roll(p, now)
	e.judge(empty)
	before := s.cur
	s.cur = max(s.cur, min(s.cur+cost, 2*p.l))
	remaining, reset := s.status(p, now)
	return taken{units: s.cur - before, remaining: remaining, reset: reset}, now, 0
}

func (s *slidingCounterState) refund(p *params, now, cost, name int64) Decision {
	now, _ = s.roll(p, now)
	switch windowIndex(p, name) {
	case s.win:
		s.cur = max(0, s.cur-cost)
	case s.win - 1:
		s.prev = max(0, s.prev-cost)
	}
	remaining, reset := s.status(p, now)
	return Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// status: remaining = ⌊L - est⌋; reset = end of the next window while cur
// holds units, else end of this one while prev does.
func (s *slidingCounterState) status(p *params, now int64) (remaining int64, reset time.Duration) {
	now, _ = s.roll(p, now)
	e := now - s.win*p.w
	est := s.prev*(p.w-e) + s.cur*p.w
	switch {
	case s.cur > 0:
		reset = microseconds((s.win+2)*p.w - now)
	case s.prev > 0:
		reset = microseconds((s.win+1)*p.w - now)
	}
	return max(0, (p.l*p.w-est)/p.w), reset
}

// idle keeps the state while the clock is behind its window (see
// fixedWindowState.idle).
func (s *slidingCounterState) idle(p *params, now int64) bool {
	if windowIndex(p, now) < s.win {
		return false
	}
	_, empty := s.roll(p, now)
	return empty
}

package limiter

// windowIndex is the aligned window now falls in: ⌊now/W⌋. Every instance
// that reads the same clock agrees on it.
func windowIndex(p *params, now int64) int64 {
	if now < 0 {
		return 0
	}
	return now / p.w
}

// fixedWindowState counts the units taken in window win.
type fixedWindowState struct {
	win   int64
	count int64
}

// roll starts a new count when now has left the stored window.
func (s *fixedWindowState) roll(p *params, now int64) {
	if idx := windowIndex(p, now); idx != s.win {
		s.win, s.count = idx, 0
	}
}

// take: allow iff count + c <= L; remaining = L - count;
// reset = retry_after = end of the window.
func (s *fixedWindowState) take(p *params, now, cost int64) Decision {
	s.roll(p, now)
	end := microseconds((s.win+1)*p.w - now)
	if s.count+cost > p.l {
		return Decision{Remaining: max(0, p.l-s.count), ResetAfter: end, RetryAfter: end, at: now}
	}
	s.count += cost
	return Decision{Allowed: true, Remaining: p.l - s.count, ResetAfter: end, at: now}
}

func (s *fixedWindowState) undo(p *params, now, cost int64, taken Decision) Decision {
	s.roll(p, now)
	if windowIndex(p, taken.at) == s.win {
		s.count = max(0, s.count-cost)
	}
	return s.status(p, now)
}

func (s *fixedWindowState) status(p *params, now int64) Decision {
	s.roll(p, now)
	d := Decision{Allowed: true, Remaining: max(0, p.l-s.count)}
	if s.count > 0 {
		d.ResetAfter = microseconds((s.win+1)*p.w - now)
	}
	return d
}

func (s *fixedWindowState) idle(p *params, now int64) bool {
	s.roll(p, now)
	return s.count == 0
}

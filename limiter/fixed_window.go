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

// roll starts a new count when now has left the stored window, and returns
// the time to decide at. A now before the stored window is taken as that
// window's start. Both stores read the clock inside the key's critical
// section (the shard's lock, the script), so this happens only when the
// clock steps back: an injected clock, or Redis's TIME after a failover to
// a master whose clock is behind. Going back to the older window would
// restart its count, and the next request would restart the newer one's:
// each flip admitted up to L more. The sliding log treats a clock stepped
// back the same way; the memory store's default clock never steps back.
func (s *fixedWindowState) roll(p *params, now int64) int64 {
	switch idx := windowIndex(p, now); {
	case idx > s.win:
		s.win, s.count = idx, 0
	case idx < s.win:
		now = s.win * p.w
	}
	return now
}

// take: allow iff count + c <= L; remaining = L - count;
// reset = retry_after = end of the window.
func (s *fixedWindowState) take(p *params, now, cost int64) Decision {
	return s.takeUpTo(p, now, cost, cost)
}

// takeUpTo takes what the window has left, up to want, when it has at
// least cost: a lease.
func (s *fixedWindowState) takeUpTo(p *params, now, cost, want int64) Decision {
	now = s.roll(p, now)
	end := microseconds((s.win+1)*p.w - now)
	if s.count+cost > p.l {
		return Decision{Remaining: max(0, p.l-s.count), ResetAfter: end, RetryAfter: end, at: now}
	}
	granted := min(want, p.l-s.count)
	s.count += granted
	return Decision{Allowed: true, Remaining: p.l - s.count, ResetAfter: end, at: now, granted: granted}
}

// charge takes cost units whether or not the window has them: the count
// goes past L, up to 2L at most (the key owes at most one quota; the part
// of a charge beyond is forgiven), and requests are refused until the
// window ends. A debt does not carry into the next window, which starts
// from zero as it always does.
func (s *fixedWindowState) charge(p *params, now, cost int64) Decision {
	now = s.roll(p, now)
	before := s.count
	s.count = max(s.count, min(s.count+cost, 2*p.l))
	d := s.status(p, now)
	d.at, d.granted = now, s.count-before
	return d
}

func (s *fixedWindowState) refund(p *params, now, cost int64, taken Decision) Decision {
	now = s.roll(p, now)
	if windowIndex(p, taken.admission()) == s.win {
		s.count = max(0, s.count-cost)
	}
	return s.status(p, now)
}

func (s *fixedWindowState) status(p *params, now int64) Decision {
	now = s.roll(p, now)
	d := Decision{Allowed: true, Remaining: max(0, p.l-s.count)}
	if s.count > 0 {
		d.ResetAfter = microseconds((s.win+1)*p.w - now)
	}
	return d
}

// idle keeps an emptied window while the clock is behind it: forgotten,
// the earlier window would be counted afresh, as the script keeps it too.
func (s *fixedWindowState) idle(p *params, now int64) bool {
	if windowIndex(p, now) < s.win {
		return false
	}
	s.roll(p, now)
	return s.count == 0
}

package limiter

import "time"

// windowIndex is the aligned window now falls in: ⌊now/W⌋. Every instance
// that reads the same clock agrees on it.
func windowIndex(p *params, now int64) int64 {
	if now < 0 {
		return 0
	}
	return now / p.w
}

// windowOf names the window now falls in and says when it ends (µs): for
// an aligned window its index ⌊now/W⌋, for a calendar window its start.
// Either name grows with time, which is all roll needs of it.
func windowOf(p *params, now int64) (win, end int64) {
	if p.cal != nil {
		return p.cal.At(now)
	}
	win = windowIndex(p, now)
	return win, (win + 1) * p.w
}

// windowBounds is the start and end (µs) of the window named win.
func windowBounds(p *params, win int64) (start, end int64) {
	if p.cal != nil {
		return win, p.cal.endOf(win)
	}
	return win * p.w, (win + 1) * p.w
}

// fixedWindowState counts the units taken in window win (see windowOf).
type fixedWindowState struct {
	win   int64
	count int64
}

// roll starts a new count when now has left the stored window, and returns
// the time to decide at, when its window ends, and whether the state held
// nothing at now (epochs.judge): a later window, or this one's count
// at zero; never while the clock is behind the stored window (see idle). A
// now before the stored window is taken as that window's start. Both
// stores read the clock inside the key's critical section (the shard's
// lock, the script), so this happens only when the clock steps back: an
// injected clock, or Redis's TIME after a failover to a master whose clock
// is behind. Going back to the older window would restart its count, and
// the next request would restart the newer one's: each flip admitted up to
// L more. The sliding log treats a clock stepped back the same way; the
// memory store's default clock never steps back.
func (s *fixedWindowState) roll(p *params, now int64) (at, end int64, empty bool) {
	win, end := windowOf(p, now)
	switch {
	case win > s.win:
		s.win, s.count = win, 0
		return now, end, true
	case win < s.win:
		now, end = windowBounds(p, s.win)
		return now, end, false
	}
	return now, end, s.count == 0
}

// take: allow iff count + c <= L; remaining = L - count;
// reset = retry_after = end of the window.
//
// With want above cost it takes what the window has left, up to want, when
// it has at least cost: a lease.
func (s *fixedWindowState) take(p *params, now, cost, want int64, e epochs) (taken, int64, int64) {
	now, end, empty := s.roll(p, now)
	e.judge(empty)
	reset := microseconds(end - now)
	if s.count+cost > p.l {
		return refused(max(0, p.l-s.count), reset, reset), now, 0
	}
	granted := min(want, p.l-s.count)
	s.count += granted
	return taken{units: granted, remaining: p.l - s.count, reset: reset}, now, 0
}

// charge takes cost units whether or not the window has them: the count
// goes past L, up to 2L at most (the key owes at most one quota; the part
// of a charge beyond is forgiven), and requests are refused until the
// window ends. A debt does not carry into the next window, which starts
// from zero as it always does.
func (s *fixedWindowState) charge(p *params, now, cost int64, e epochs) (taken, int64, int64) {
	now, end, empty := s.roll(p, now)
	e.judge(empty)
	before := s.count
	s.count = max(s.count, min(s.count+cost, 2*p.l))
	remaining, reset := s.status(p, now, end)
	return taken{units: s.count - before, remaining: remaining, reset: reset}, now, 0
}

func (s *fixedWindowState) refund(p *params, now, cost, name int64) Decision {
	now, end, _ := s.roll(p, now)
	if s.holds(p, name, end) {
		s.count = max(0, s.count-cost)
	}
	remaining, reset := s.status(p, now, end)
	return Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// holds reports whether an admission at time adm was counted in the
// stored window, which ends at end.
func (s *fixedWindowState) holds(p *params, adm, end int64) bool {
	if p.cal != nil {
		return adm >= s.win && adm < end
	}
	return windowIndex(p, adm) == s.win
}

// status is the state after roll as a report's remaining and reset: what
// a refund of nothing reports.
func (s *fixedWindowState) status(p *params, now, end int64) (remaining int64, reset time.Duration) {
	if s.count > 0 {
		reset = microseconds(end - now)
	}
	return max(0, p.l-s.count), reset
}

// idle keeps an emptied window while the clock is behind it: forgotten,
// the earlier window would be counted afresh, as the script keeps it too.
func (s *fixedWindowState) idle(p *params, now int64) bool {
	if win, _ := windowOf(p, now); win < s.win {
		return false
	}
	s.roll(p, now)
	return s.count == 0
}

package limiter

import "time"

// slidingLogState keeps the admissions of the last window, oldest first,
// each packed into one uint64: the admission time in µs above logUnitBits,
// its units below. ents[head:] are live; total is the sum of their units.
type slidingLogState struct {
	ents  []uint64
	head  int
	total int64
}

const logUnitMask = 1<<logUnitBits - 1

func logEntry(at, units int64) uint64 { return uint64(at)<<logUnitBits | uint64(units) }
func logAt(e uint64) int64            { return int64(e >> logUnitBits) }
func logUnits(e uint64) int64         { return int64(e & logUnitMask) }

// expire drops entries that left the window (now - W, now].
func (s *slidingLogState) expire(p *params, now int64) {
	for s.head < len(s.ents) && logAt(s.ents[s.head]) <= now-p.w {
		s.total -= logUnits(s.ents[s.head])
		s.head++
	}
	if s.head == len(s.ents) {
		s.ents, s.head = s.ents[:0], 0
	}
}

// push appends an admission, first reusing the space of expired entries
// so the slice holds at most about twice the live entries.
func (s *slidingLogState) push(at, units int64) {
	if s.head > 0 && len(s.ents) == cap(s.ents) {
		n := copy(s.ents, s.ents[s.head:])
		s.ents, s.head = s.ents[:n], 0
	}
	for units > 0 {
		u := min(units, logUnitMask)
		s.ents = append(s.ents, logEntry(at, u))
		units -= u
	}
}

// take: allow iff count + c <= L, then append (now, c); remaining = L - count;
// reset = newest + W - now; retry_after = when enough of the oldest leave.
//
// With want above cost it takes what the window has left, up to want, when
// it has at least cost: a lease, logged as one admission of every unit
// granted. A lease of more than the request's cost is logged LeaseLifetime
// ahead, at the latest time a nearcache.Cache may spend it: logged at its
// grant, a unit spent up to a lifetime later would leave the window that
// much early, and instances together could admit more than L in a
// window-long span (by up to a lease per instance). Logged ahead, every
// unit is in the log from its grant until W after its spend, so the log's
// own check bounds every span of spend times by L; the price is that leased
// units block their key up to a lifetime longer.
func (s *slidingLogState) take(p *params, now, cost, want int64, e epochs) (taken, int64, int64) {
	now = max(now, 0)
	s.expire(p, now)
	e.judge(len(s.ents) == s.head)
	if s.total+cost > p.l {
		remaining, reset := s.status(p, now)
		return refused(remaining, reset, microseconds(s.retryAfter(p, now, s.total+cost-p.l))), now, 0
	}
	granted := min(want, p.l-s.total)
	at := now
	if granted > cost {
		at += LeaseLifetime.Microseconds()
	}
	mark := s.record(at, granted)
	remaining, reset := s.status(p, now)
	return taken{units: granted, remaining: remaining, reset: reset}, now, mark
}

// record logs units at time at, or at the newest entry's time if that is
// later, so entries stay in time order even if the clock stepped back (or
// a lease was logged ahead), and answers the time it logged them at.
func (s *slidingLogState) record(at, units int64) int64 {
	if n := len(s.ents); n > s.head {
		at = max(at, logAt(s.ents[n-1]))
	}
	s.push(at, units)
	s.total += units
	return at
}

// charge logs cost units at now whether or not the window has them: the
// log holds more than L, up to 2L units at most (the key owes at most one
// quota; the part of a charge beyond is forgiven), and requests are
// refused until enough of the oldest entries have left the window. Like
// an admission, the entry is stamped max(now, newest entry), so the log
// stays ordered (after a lease logged ahead, or a clock stepped back).
func (s *slidingLogState) charge(p *params, now, cost int64, e epochs) (taken, int64, int64) {
	now = max(now, 0)
	s.expire(p, now)
	e.judge(len(s.ents) == s.head)
	units := max(0, min(cost, 2*p.l-s.total))
	mark := s.record(now, units)
	remaining, reset := s.status(p, now)
	return taken{units: units, remaining: remaining, reset: reset}, now, mark
}

// retryAfter is how long until the oldest entries holding at least need
// units have left the window.
func (s *slidingLogState) retryAfter(p *params, now, need int64) int64 {
	for _, e := range s.ents[s.head:] {
		need -= logUnits(e)
		if need <= 0 {
			return logAt(e) + p.w - now
		}
	}
	return p.w
}

func (s *slidingLogState) refund(p *params, now, cost, at int64) Decision {
	s.expire(p, now)
	for i := len(s.ents) - 1; i >= s.head && cost > 0; i-- {
		e := s.ents[i]
		if logAt(e) != at {
			if logAt(e) < at {
				break
			}
			continue
		}
		u := min(cost, logUnits(e))
		cost -= u
		s.total -= u
		if u == logUnits(e) {
			s.ents = append(s.ents[:i], s.ents[i+1:]...)
		} else {
			s.ents[i] = logEntry(at, logUnits(e)-u)
		}
	}
	remaining, reset := s.status(p, now)
	return Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// status is the state as a report's remaining = L - count and reset =
// newest + W - now.
func (s *slidingLogState) status(p *params, now int64) (remaining int64, reset time.Duration) {
	if n := len(s.ents); n > s.head {
		reset = microseconds(max(0, logAt(s.ents[n-1])+p.w-now))
	}
	return max(0, p.l-s.total), reset
}

// idle also gives memory back: a log whose live entries fill less than a
// quarter of its slice is copied into a smaller one.
func (s *slidingLogState) idle(p *params, now int64) bool {
	s.expire(p, now)
	live := len(s.ents) - s.head
	if live == 0 {
		s.ents, s.head = nil, 0
		return true
	}
	if cap(s.ents) > 8 && live*4 < cap(s.ents) {
		s.ents, s.head = append(make([]uint64, 0, live*2), s.ents[s.head:]...), 0
	}
	return false
}

package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// The bounds the checks hold each algorithm to, from the docs
// (docs/guarantees.md, docs/near-cache.md, docs/redis.md):
//   - memory fixed_window (cw, lc, wf): exact, on the test's clock: a request
//     passes only while its window's count plus its cost (at least one
//     unit: "Costs from the request") fits the quota; a charge takes the
//     count up to twice the quota at most ("Costs from the response").
//   - concurrency (cc, rc, wc): at most L requests of a key in flight
//     ("Algorithms"), each holding its cost, and at least one slot;
//     an override's limit counts the requests in flight admitted under
//     another (docs/design.md "Runtime overrides: the adapter": a
//     concurrency zone's state is the requests in flight).
//   - leaky_bucket (lb): a queue of burst places draining at r, so at
//     most B + r × (b − a) admissions in any span [a, b].
//   - redis zones with leases ("The near cache"): fixed_window at most L
//     in every window, sliding_window_log at most L in every window-long
//     span, token_bucket B + r × T plus r × 1 s for the lease, on
//     Redis's TIME (see checkRedis). After an admin reset the docs
//     allow (instances − 1) leases that other instances took before
//     it; here the reset reaches every instance's near cache (one
//     process's admin API answers for every zone of the name, as one
//     reset: admin.go resetKey), so none.
//   - redis zones when instance 0 decides by its own clock, δ = |skew|
//     from Redis's TIME (docs/redis.md, "Servers that refuse TIME in
//     scripts", "What that costs": "a skew of δ between instances moves
//     window edges and refills by δ"), with every key outliving its
//     state by a second on the clock that wrote it, so that skew costs
//     no more than that:
//       - fixed_window: the instance ahead starts a key's next window up
//         to δ early and the one behind then counts in it too, "so a
//         window can be up to δ shorter"; no window counts more than L.
//         Exactly: each admission is counted in one window, between the
//         one its instance's clock was in while it ran and the latest a
//         key of its zone and key can have held by then (a clock behind
//         decides in the later window a key holds: lua/fixed_window.lua's
//         behind), and no window holds more than L (checkWindows,
//         windowsOf). That catches a window counted twice: a key gone at
//         the end of its window on the writer's clock while the clock
//         behind still says that window, which starts it afresh.
//       - sliding_window_log: "holds its limit over any span of W − δ
//         rather than W": an entry is stamped by its instance's clock
//         and leaves the log when a decision's clock is W past the stamp,
//         which the clock ahead reaches δ early for an entry of the clock
//         behind; so a decision counts, exactly, every entry less than
//         W − (d_max − d) of real time before it, d being the clock offset
//         of the entry's instance and d_max the greatest (W − δ for an
//         entry of the clock behind, W for the other's).
//       - token_bucket: "can refill up to δ early (up to r × δ more
//         units)": B + r × (T + δ), plus r × 1 s for the lease.
//   - zones with `global` (gf, gt; docs/regions.md, "What it
//     guarantees"), their instances in two regions: every admission in
//     any region spends a unit global counted, so fixed_window at most L
//     per window over all instances (a batch lapses at its window's end),
//     and token_bucket B + r × T + r × (1 s + the refund delay), + r × 2 s
//     with local_quota; on the servers' TIME (one machine's clock), so
//     without skew. An admin reset reaches every instance's zone of the
//     name here, so both regions' pools and global start afresh, and
//     an override is set in both regions' sets at once.
//     sliding_window_counter (the documented bound is fixed_window's) and
//     leaky_bucket (token_bucket's) have no redis zone here.
//   - response_cost: what a charge takes past the up-front cost is the
//     bound docs/shaped-limits.md documents ("Costs from the
//     response"); the checks count only up-front costs, less what
//     settling gave back.

// checkAdmission checks a new admission against its limit.
func (m *hmModel) checkAdmission(a *hmAdm, f *hmFlight) {
	r := m.r
	switch {
	case a.state == "": // a race step's, either epoch's
	case a.z.alg == "fixed_window" && !a.z.redis:
		w := m.fwOf(a.state)
		win := a.at / a.window.Microseconds()
		need := max(a.cost, 1)
		excess := w[win] + need - a.quota
		r.totals.note("memory fixed_window", excess, "0, exact")
		if excess > 0 {
			r.fail("%s admitted in zone %s: its window held %d of %d units (state %s), so a cost of %d (at least one unit) did not fit", f.q, a.z.id, w[win], a.quota, a.state, a.cost)
		}
		w[win] += a.cost
	case a.z.alg == "concurrency":
		load := int64(0)
		var ids []int
		for _, b := range m.adms {
			if b != a && b.inflight && b.load == a.load {
				load += max(b.cost, 1)
				ids = append(ids, b.id)
			}
		}
		excess := load + max(a.cost, 1) - a.quota
		r.totals.note(a.z.store()+" concurrency", excess, "0")
		if excess > 0 {
			r.fail("%s admitted in zone %s with %d units already in flight (admissions %v) under a limit of %d (state %s): each request holds its cost and at least one slot%s", f.q, a.z.id, load, ids, a.quota, a.state, m.concurrencyHint(a))
		}
	case a.z == hmLB:
		m.checkBucket(a.state, "memory leaky_bucket", hmLBBurst, hmLBRate, time.Second)
	case a.z == hmMT:
		m.checkBucket(a.state, "memory token_bucket", a.quota, a.quota, a.window)
	case a.z == hmML:
		m.checkLog(a)
	case a.z.redis:
		m.checkRedis(a.state, a.z)
	}
}

// concurrencyHint names the known failure modes a concurrency excess
// involves, for the failure message.
func (m *hmModel) concurrencyHint(a *hmAdm) string {
	cost0, other := a.cost == 0, false
	for _, b := range m.adms {
		if b.inflight && b.load == a.load && b != a {
			cost0 = cost0 || b.cost == 0
			other = other || b.state != a.state
		}
	}
	hint := ""
	if cost0 {
		hint += "; requests of cost 0 among them (step kind cost0)"
	}
	if other {
		hint += "; some were admitted under another limit of the key, an override since changed or lapsed (step kinds ovconc, concexpiry)"
	}
	return hint
}

func (z *hmZone) store() string {
	if z.global {
		return "regions"
	}
	if z.redis {
		return "redis"
	}
	return "memory"
}

// checkBucket holds a bucket's admissions of state to B + r(b−a) in
// every span, r = L/W, in exact integers: units × W ≤ B × W + L × (b − a).
// Refunds come within their request, on a clock that does not move
// meanwhile, so they add no slack.
func (m *hmModel) checkBucket(state, check string, burst, events int64, window time.Duration) {
	var as []*hmAdm
	for _, a := range m.adms {
		if a.state == state {
			as = append(as, a)
		}
	}
	slices.SortStableFunc(as, func(x, y *hmAdm) int { return int(x.at - y.at) })
	w := window.Microseconds()
	worst := int64(-1 << 62)
	for i := range as {
		units := int64(0)
		for j := i; j < len(as); j++ {
			units += as[j].counted
			slack := burst*w + events*(as[j].at-as[i].at)
			if over := units*w - slack; over > worst {
				worst = over
			}
			if units*w > slack {
				m.r.fail("%s %s: %d units admitted in %v, bound B + r×span = %.3f (admissions %d..%d)",
					check, state, units, time.Duration(as[j].at-as[i].at)*time.Microsecond, float64(slack)/float64(w), as[i].id, as[j].id)
				return
			}
		}
	}
	if len(as) > 0 {
		m.r.totals.note(check, ceilDiv(worst, w), "B + r×span")
	}
}

// checkLog holds the sliding log's admissions of a's state to L in the
// window that ends at a: those less than W before it. An admission
// exactly W before has left the window or not, as the store rounds; it
// is left out, which can only miss an excess.
func (m *hmModel) checkLog(a *hmAdm) {
	units := m.logUnits(a.state, a.at, a.window)
	m.r.totals.note("memory sliding_window_log", units-a.quota, "L per window-long span")
	if units > a.quota {
		m.r.fail("memory sliding_window_log %s: %d units admitted in the window ending at admission %d, limit %d:%s", a.state, units, a.id, a.quota, m.describe(a.state))
	}
}

// logUnits is what state's admissions hold in the W that ends at t.
func (m *hmModel) logUnits(state string, t int64, w time.Duration) int64 {
	units := int64(0)
	for _, b := range m.adms {
		if b.state == state && b.at > t-w.Microseconds() && b.at <= t {
			units += b.counted
		}
	}
	return units
}

func ceilDiv(a, b int64) int64 {
	if a >= 0 {
		return (a + b - 1) / b
	}
	return -((-a) / b)
}

// checkRedis holds a redis zone's state to its limit (see the bounds
// above). Its admissions are timed by Redis's TIME, real time, or by
// instance 0's clock, real time plus its skew, which the test knows only
// as the span of each request ([lo, hi], in real time), so each check
// counts only the admissions certainly inside the span it checks: it can
// miss an excess at the edges, never invent one.
func (m *hmModel) checkRedis(state string, z *hmZone) {
	var as []*hmAdm
	for _, a := range m.adms {
		if a.state == state {
			as = append(as, a)
		}
	}
	if len(as) == 0 {
		return
	}
	quota, w := as[0].quota, as[0].window.Microseconds()
	check := z.store() + " " + z.alg
	worst, bound, fail := int64(math.MinInt64), "", ""
	switch z.alg {
	case "fixed_window":
		bound = "L per window, windows placed by skew"
		worst, fail = m.checkWindows(as, quota, w)
	case "sliding_window_log":
		bound = "L per span of W, W − δ for entries of a clock behind another"
		dmax := max(m.offset(z, 0), 0)
		for _, a := range as {
			u := a.counted
			for _, b := range as {
				// b's entry stays in a's log for W − (dmax − d_b) of
				// real time at least (see the bounds above).
				span := w - (dmax - m.offset(z, b.inst))
				if b != a && b.lo > a.hi-span && b.hi <= a.lo {
					u += b.counted
				}
			}
			worst = max(worst, u-quota)
			if u > quota {
				fail = fmt.Sprintf("%d units in the window ending at admission %d", u, a.id)
			}
		}
	case "token_bucket":
		// units × W ≤ B × W + L × (span + δ + 1s + the longest request,
		// in which a refund may come after its take), in exact integers.
		bound = "B + r×(T + δ) + r×1s"
		skew := m.r.skew.Abs().Microseconds()
		if z.global {
			// Regions: units taken from global's bucket at a refill are
			// spent up to a batch's lifetime (1 s) later, and r×2 s more
			// with local_quota on top (docs/regions.md, "What it
			// guarantees"); the near cache's lease second is within
			// those. On the servers' TIME: no skew.
			bound, skew = "B + r×T + r×(1s + refund delay)", 0
			if m.r.regionLease {
				bound, skew = bound+" + r×2s (local_quota)", 2*time.Second.Microseconds()
			}
		}
		for _, a := range as {
			for _, e := range as {
				if e.hi < a.lo {
					continue
				}
				u, longest := int64(0), int64(0)
				for _, b := range as {
					if b.lo >= a.lo && b.hi <= e.hi {
						u += b.counted
						longest = max(longest, b.hi-b.lo)
					}
				}
				slack := quota*w + quota*(e.hi-a.lo+skew+time.Second.Microseconds()+longest)
				worst = max(worst, ceilDiv(u*w-slack, w))
				if u*w > slack {
					fail = fmt.Sprintf("%d units between admissions %d and %d, %v apart at most", u, a.id, e.id, time.Duration(e.hi-a.lo)*time.Microsecond)
				}
			}
		}
	}
	m.r.totals.note(check, worst, bound)
	if fail != "" {
		hint := ""
		if m.raced[stateBase(state)] {
			hint = "; the state was reset while lease refills were in flight (step kind race)"
		}
		m.r.fail("redis zone %s state %s: %s, limit %d (bound %s):%s%s", z.id, state, fail, quota, bound, m.describe(state), hint)
	}
}

// onEdge reports whether an admission of state is exactly W before now,
// where the log's rounding decides whether it still counts.
func (m *hmModel) onEdge(state string, now int64, w time.Duration) bool {
	for _, a := range m.adms {
		if a.state == state && a.at == now-w.Microseconds() {
			return true
		}
	}
	return false
}

// describe lists the admissions of state.
func (m *hmModel) describe(state string) string {
	s := ""
	for _, a := range m.adms {
		if a.state == state {
			s += fmt.Sprintf(" #%d(i%d cost %d counted %d", a.id, a.inst, a.cost, a.counted)
			if a.z.redis {
				s += fmt.Sprintf(" real %d..%dµs", a.lo%1e8, a.hi%1e8)
			}
			s += ")"
		}
	}
	return s
}

// quiet lets every request in flight finish and checks that every store
// holds what the model says: nothing lost or counted twice.
func (r *hmRun) quiet(why string) {
	r.finishAll()
	if r.failure != "" {
		return
	}
	ctx := context.Background()
	checked := 0
	for _, in := range r.inst {
		for _, z := range []*hmZone{hmCW, hmLC, hmML, hmWF, hmWC, hmCC, hmRC} {
			for _, key := range r.keys {
				for _, plan := range []string{"", "pro"} {
					if plan != "" && z != hmCW {
						continue
					}
					at := r.timeFor(z)
					now := at.UnixMicro()
					l := r.m.limitAt(in, z, key, plan, now)
					if l.action != "limit" {
						continue
					}
					zz := r.zoneOf(in, z)
					res := zz.resolve(key, true, plan, nil, at)
					lim, state := res.limit, res.state
					if res.verdict != verdictDecide {
						r.fail("%s: zone %s key %s: the handler finds it exempt or blocked, the model a limit (%s)", why, z.id, key, l.state)
						return
					}
					d, err := lim.store.Peek(ctx, state)
					if err != nil {
						r.fail("%s: peek %s %s: %v", why, z.id, key, err)
						return
					}
					want := l.quota
					switch z.alg {
					case "fixed_window":
						win := now / l.window.Microseconds()
						want = max(0, l.quota-r.m.fw[l.state][win])
					case "sliding_window_log":
						if r.m.onEdge(l.state, now, l.window) {
							continue
						}
						want = max(0, l.quota-r.m.logUnits(l.state, now, l.window))
					}
					checked++
					if d.Remaining != want {
						hint := ""
						if r.m.left[l.state] {
							hint = "; a client left while a later zone held its request (step kind leave)"
						}
						r.fail("%s: instance %d zone %s key %s plan %q: the store has %d units left, the model %d (state %s)%s", why, in.i, z.id, key, plan, d.Remaining, want, l.state, hint)
						return
					}
				}
			}
		}
	}
	r.compared += checked
	r.logf("quiet (%s): %d states as the model says", why, checked)
}

// finalRedis checks, once the schedule has ended, what Redis holds for
// each redis fixed_window state in force: every instance's handlers are
// cleaned up first, so every lease goes back to Redis
// (docs/near-cache.md) and Redis counts exactly what was admitted in the
// window current. A state that took a charge, or whose admissions or reading
// straddle a window edge, or that a race step left unsure of, is not
// compared. With regions, gf's count on the global server too: each
// instance's Cleanup returns the batches it installed (after its near
// cache's leases went back into them), so global counts exactly what
// was admitted in the window current, in both regions.
//
// Only here are the zones with `global` compared with their stores: at
// a quiet point (hmRun.quiet) global still counts the units the regions'
// pools hold, spendable until their batch lapses (a second, or the
// window's end) and returned to global up to a quarter second after
// that by the instance that installed the batch; the model would have to
// follow each batch's units, lifetime and janitor to say what global and
// each pool hold then, and the regional store's own model test
// (limiter/regional TestModel) does just that. A schedule's end, once
// every batch went back, is the point where the count is the model's.
func (r *hmRun) finalRedis() {
	type peek struct {
		z     *hmZone
		key   string
		l     hmLimit
		redis *redisstore.Store
		state string
		inst  int
	}
	var peeks []peek
	seen := map[string]bool{}
	// Peeks go through the instance whose clock is furthest ahead: a
	// lease given back in a later window than it was taken in stays in
	// Redis (a give-back counts only in its own window), where a clock
	// behind the one that gave it back can still read it, though the
	// model cannot know it (refused requests took it).
	peeker := r.inst[0]
	for _, in := range r.inst {
		if r.m.offset(hmRF, in.i) > r.m.offset(hmRF, peeker.i) {
			peeker = in
		}
	}
	zones := []*hmZone{hmRF, hmRW}
	if r.regions {
		zones = append(zones, hmGF)
	}
	for _, in := range []*hmInstance{peeker} {
		for _, z := range zones {
			for _, key := range r.keys {
				now := r.rclock.Now()
				l := r.m.limitAt(in, z, key, "", now.UnixMicro())
				if l.action != "limit" || seen[l.state] || r.m.ambiguous[l.state] || r.m.charged[l.state] > 0 {
					continue
				}
				seen[l.state] = true
				zz := r.zoneOf(in, z)
				res := zz.resolve(key, true, "", nil, now)
				lim, state := res.limit, res.state
				if res.verdict != verdictDecide || lim.redis == nil {
					continue
				}
				peeks = append(peeks, peek{z, key, l, lim.redis, state, in.i})
			}
		}
	}
	r.finishAll()
	r.countReclaims()
	for _, in := range r.inst {
		_ = in.h.Cleanup()
		_ = in.hr.Cleanup()
		if in.hg != nil {
			_ = in.hg.Cleanup()
		}
		in.cleaned = true
	}
	ctx := context.Background()
	compared := 0
	for _, p := range peeks {
		w := p.l.window.Microseconds()
		before := time.Now().UnixMicro()
		d, err := p.redis.Peek(ctx, p.state)
		after := time.Now().UnixMicro()
		if err != nil {
			r.fail("end: peek %s %s: %v", p.z.id, p.key, err)
			return
		}
		// The peek reads the window of its instance's clock, or a later
		// one a key holds (windowsOf): compared only when every admission
		// of the zone and key that can be in that window or a later one is
		// certainly in that one.
		off := r.m.offset(p.z, p.inst)
		if floorDiv(before+off, w) != floorDiv(after+off, w) {
			continue
		}
		win := floorDiv(before+off, w)
		var units int64
		sure := true
		for _, a := range r.m.adms {
			if a.z != p.z || a.key != p.key {
				continue
			}
			s, e := r.m.windowsOf(a, w)
			switch {
			case e < win:
			case a.state == p.l.state && s == win && e == win:
				units += a.stored
			default:
				sure = false
			}
		}
		if !sure {
			continue
		}
		compared++
		if want := max(0, p.l.quota-units); d.Remaining != want {
			r.fail("end: redis zone %s key %s: Redis has %d units left in the window, the model %d (state %s:%s)", p.z.id, p.key, d.Remaining, want, p.l.state, r.m.describe(p.l.state))
			return
		}
	}
	r.comparedRedis += compared
	r.logf("end: %d redis states as the model says", compared)
}

// windowsOf is the range of aligned windows [s, e] (indices of W µs on
// the clock that decided it) a redis fixed_window admission can have been
// counted in. Each instance's scripts read their own clock, real time plus
// offset: the window its clock was in while a ran is the least; a clock
// behind decides in the later window a key holds (lua/fixed_window.lua's
// behind: "as fixedWindowState.roll does"), which only a request of the
// same zone and key (hmModel.writers, admitted or not) can have written
// by then, in its own clock's window at
// most, as far as it had run (to its end, or a's: a charge writes when its
// response ends), recorded or still pending. With every instance on one
// clock this is the windows a spans.
func (m *hmModel) windowsOf(a *hmAdm, w int64) (s, e int64) {
	d := m.offset(a.z, a.inst)
	s, e = floorDiv(a.lo+d, w), floorDiv(a.hi+d, w)
	for _, b := range m.writers {
		if b.z != a.z || b.key != a.key || b.lo >= a.hi {
			continue
		}
		end := a.hi
		if b.until != 0 {
			end = min(end, b.until)
		}
		e = max(e, floorDiv(end+m.offset(b.z, b.inst), w))
	}
	for _, f := range m.pending {
		if f.q.key != a.key || !slices.Contains(hmRoutes[f.q.route], a.z) || f.realStart >= a.hi {
			continue
		}
		e = max(e, floorDiv(min(a.hi, f.realEnd)+m.offset(a.z, f.q.inst), w))
	}
	return s, e
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// checkWindows holds a redis fixed_window state's admissions as to L per
// window, each in one of the windows windowsOf allows: for every run of
// windows [p, q], those that must fall in it hold at most L × (q − p + 1)
// units (what any placement of them needs). It returns the largest excess
// and a failure, if any.
func (m *hmModel) checkWindows(as []*hmAdm, quota, w int64) (int64, string) {
	type placed struct {
		a    *hmAdm
		s, e int64
	}
	ps := make([]placed, 0, len(as))
	for _, a := range as {
		s, e := m.windowsOf(a, w)
		ps = append(ps, placed{a, s, e})
	}
	slices.SortFunc(ps, func(x, y placed) int { return cmp.Compare(x.e, y.e) })
	worst, fail := int64(math.MinInt64), ""
	for _, first := range ps {
		p := first.s
		u := int64(0)
		var ids []int
		for _, b := range ps { // by e: each q once all that end by it are in
			if b.s < p {
				continue
			}
			u += b.a.counted
			ids = append(ids, b.a.id)
			excess := u - quota*(b.e-p+1)
			worst = max(worst, excess)
			if excess > 0 && fail == "" {
				fail = fmt.Sprintf("%d units in windows %d..%d (admissions %v, each counted in one of them on its instance's clock), %d allowed", u, p, b.e, ids, quota*(b.e-p+1))
			}
		}
	}
	return worst, fail
}

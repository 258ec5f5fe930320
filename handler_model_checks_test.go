package ratelimit

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// The bounds the checks hold each algorithm to, from README.md:
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
//     in every aligned window, sliding_window_log at most L in every
//     window-long span, token_bucket B + r × T plus r × 1 s for the
//     lease, on Redis's TIME (see checkRedis). After an admin reset the
//     README allows (instances − 1) leases that other instances took
//     before it; here the reset reaches every instance's near cache (one
//     process's admin API answers for every zone of the name), so none.
//   - response_cost: what a charge takes past the up-front cost is the
//     README's documented bound ("Costs from the response"); the checks
//     count only up-front costs, less what settling gave back.

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
// above). Its admissions are timed by Redis's TIME, real time, which the
// test knows only as the span of each request ([lo, hi]), so each check
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
		bound = "L per aligned window"
		byWin := map[int64]int64{}
		for _, a := range as {
			if a.lo/w == a.hi/w {
				byWin[a.lo/w] += a.counted
			}
		}
		for win, u := range byWin {
			worst = max(worst, u-quota)
			if u > quota {
				fail = fmt.Sprintf("%d units in aligned window %d", u, win)
			}
		}
	case "sliding_window_log":
		bound = "L per window-long span"
		for _, a := range as {
			u := a.counted
			for _, b := range as {
				if b != a && b.lo > a.hi-w && b.hi <= a.lo {
					u += b.counted
				}
			}
			worst = max(worst, u-quota)
			if u > quota {
				fail = fmt.Sprintf("%d units in the window ending at admission %d", u, a.id)
			}
		}
	case "token_bucket":
		// units × W ≤ B × W + L × (span + 1s + the longest request, in
		// which a refund may come after its take), in exact integers.
		bound = "B + r×T + r×1s"
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
				slack := quota*w + quota*(e.hi-a.lo+time.Second.Microseconds()+longest)
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
					base := &zz.limit
					if plan != "" {
						base = zz.tiers[plan]
					}
					lim, state, _, blocked := zz.keyOverride(key, base, at)
					if lim == nil || blocked > 0 {
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
// cleaned up first, so every lease goes back to Redis (README.md "The
// near cache") and Redis counts exactly what was admitted in the window
// current. A state that took a charge, or whose admissions or reading
// straddle a window edge, or that a race step left unsure of, is not
// compared.
func (r *hmRun) finalRedis() {
	type peek struct {
		z     *hmZone
		key   string
		l     hmLimit
		redis *limiter.Redis
		state string
	}
	var peeks []peek
	seen := map[string]bool{}
	for _, in := range r.inst {
		for _, z := range []*hmZone{hmRF, hmRW} {
			for _, key := range r.keys {
				now := r.rclock.Now()
				l := r.m.limitAt(in, z, key, "", now.UnixMicro())
				if l.action != "limit" || seen[l.state] || r.m.ambiguous[l.state] || r.m.charged[l.state] > 0 {
					continue
				}
				seen[l.state] = true
				zz := r.zoneOf(in, z)
				lim, state, _, _ := zz.keyOverride(key, &zz.limit, now)
				if lim == nil || lim.redis == nil {
					continue
				}
				peeks = append(peeks, peek{z, key, l, lim.redis, state})
			}
		}
	}
	r.finishAll()
	for _, in := range r.inst {
		_ = in.h.Cleanup()
		_ = in.hr.Cleanup()
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
		if before/w != after/w {
			continue
		}
		var units int64
		sure := true
		for _, a := range r.m.adms {
			if a.state != p.l.state {
				continue
			}
			switch {
			case a.lo/w == before/w && a.hi/w == before/w:
				units += a.stored
			case a.hi/w >= before/w:
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

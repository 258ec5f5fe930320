package ratelimit

import (
	"context"
	"fmt"
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
//     lease. Their windows outlast a schedule (hmRedisWindow), so a state
//     is held to that over all its admissions. After an admin reset the
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

// checkRedis holds a redis zone's state to its limit over its
// admissions (see the bounds above).
func (m *hmModel) checkRedis(state string, z *hmZone) {
	byWin := map[int64]int64{}
	var quota, units int64
	lo, hi := int64(1<<62), int64(0)
	for _, a := range m.adms {
		if a.state != state {
			continue
		}
		quota = a.quota
		lo, hi = min(lo, a.lo), max(hi, a.hi)
		units += a.counted
		if z.alg == "fixed_window" {
			wl, wh := a.lo/hmRedisWindow.Microseconds(), a.hi/hmRedisWindow.Microseconds()
			if wl == wh {
				byWin[wl] += a.counted
			}
		}
	}
	check, bound, allowed := z.store()+" "+z.alg, "L", quota
	switch z.alg {
	case "fixed_window":
		units = 0
		for _, u := range byWin {
			units = max(units, u)
		}
		bound = "L per aligned window"
	case "sliding_window_log":
		bound = "L per window-long span"
	case "token_bucket":
		span := hi - lo + time.Second.Microseconds()
		allowed = quota + ceilDiv(quota*span, hmRedisWindow.Microseconds())
		bound = "B + r×T + r×1s"
	}
	m.r.totals.note(check, units-quota, bound)
	if units > allowed {
		hint := ""
		if m.raced[stateBase(state)] {
			hint = "; the state was reset while lease refills were in flight (step kind race)"
		}
		m.r.fail("redis zone %s state %s: %d units admitted, bound %s = %d:%s%s", z.id, state, units, bound, allowed, m.describe(state), hint)
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
			s += fmt.Sprintf(" #%d(i%d cost %d counted %d)", a.id, a.inst, a.cost, a.counted)
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
	now := r.clock.Now().UnixMicro()
	ctx := context.Background()
	checked := 0
	for _, in := range r.inst {
		for _, z := range []*hmZone{hmCW, hmLC, hmML, hmWF, hmWC, hmCC, hmRC} {
			for _, key := range r.keys {
				for _, plan := range []string{"", "pro"} {
					if plan != "" && z != hmCW {
						continue
					}
					l := r.m.limitFor(in, z, key, plan, now)
					if l.action != "limit" {
						continue
					}
					zz := r.zoneOf(in, z)
					base := &zz.limit
					if plan != "" {
						base = zz.tiers[plan]
					}
					lim, state, _, blocked := zz.keyOverride(key, base, r.clock.Now())
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
	r.logf("quiet (%s): %d states as the model says", why, checked)
}

// finalRedis checks, once the schedule has ended, what Redis holds for
// each redis zone's states in force: every instance's handler is cleaned
// up first, so every lease goes back to Redis (README.md "The near
// cache") and Redis counts exactly what was admitted.
func (r *hmRun) finalRedis() {
	type peek struct {
		z      *hmZone
		key    string
		l      hmLimit
		redis  *limiter.Redis
		state  string
		events int64
	}
	var peeks []peek
	now := r.clock.Now().UnixMicro()
	seen := map[string]bool{}
	for _, in := range r.inst {
		for _, z := range []*hmZone{hmRF, hmRL, hmRT, hmRW} {
			for _, key := range r.keys {
				l := r.m.limitFor(in, z, key, "", now)
				if l.action != "limit" || seen[l.state] || r.m.ambiguous[l.state] {
					continue
				}
				seen[l.state] = true
				zz := r.zoneOf(in, z)
				lim, state, _, _ := zz.keyOverride(key, &zz.limit, r.clock.Now())
				if lim == nil || lim.redis == nil {
					continue
				}
				peeks = append(peeks, peek{z, key, l, lim.redis, state, in.cfg.events[z.id]})
			}
		}
	}
	for _, in := range r.inst {
		_ = in.h.Cleanup()
		in.cleaned = true
	}
	ctx := context.Background()
	for _, p := range peeks {
		d, err := p.redis.Peek(ctx, p.state)
		if err != nil {
			r.fail("end: peek %s %s: %v", p.z.id, p.key, err)
			return
		}
		var units int64
		realNow := time.Now().UnixMicro()
		for _, a := range r.m.adms {
			if a.state != p.l.state {
				continue
			}
			if p.z.alg == "fixed_window" && a.lo/hmRedisWindow.Microseconds() != realNow/hmRedisWindow.Microseconds() {
				continue
			}
			units += a.stored
		}
		units += r.m.charged[p.l.state]
		want := max(0, p.l.quota-units)
		ok := d.Remaining == want
		if p.z.alg == "token_bucket" {
			// The bucket refills by r × the schedule's length meanwhile.
			ok = d.Remaining >= want && d.Remaining <= want+1+ceilDiv(p.l.quota*int64(time.Minute/time.Microsecond), hmRedisWindow.Microseconds())
		}
		if !ok {
			r.fail("end: redis zone %s key %s: Redis has %d units left, the model %d (state %s:%s)", p.z.id, p.key, d.Remaining, want, p.l.state, r.m.describe(p.l.state))
			return
		}
	}
	r.logf("end: %d redis states as the model says", len(peeks))
}

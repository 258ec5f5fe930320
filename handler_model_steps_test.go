package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// doStep picks one step of the schedule and runs it.
func (r *hmRun) doStep() {
	if r.mixed && !hmSkips("edge") && r.rng.IntN(hmEdgeOdds) == 0 {
		r.edge()
		return
	}
	switch n := r.rng.IntN(100); {
	case n < 14:
		r.request(hmCW)
	case n < 22:
		r.request([]*hmZone{hmML, hmMT, hmWF}[r.rng.IntN(3)])
	case n < 30:
		unlessSkipped("hold", func() { r.request(hmLB) })
	case n < 44:
		unlessSkipped("conc", func() { r.request([]*hmZone{hmCC, hmRC}[r.rng.IntN(2)]) })
	case n < 56:
		if r.regions && r.rng.IntN(2) == 0 {
			r.regionBurst()
			return
		}
		r.request([]*hmZone{hmRF, hmRL, hmRT, hmRW}[r.rng.IntN(4)])
	case n < 60:
		unlessSkipped("busy", r.busy)
	case n < 70:
		if len(r.flights) > 0 {
			r.finish(r.rng.IntN(len(r.flights)))
		}
	case n < 76:
		unlessSkipped("step", r.clockStep)
	case n < 78:
		unlessSkipped("sleep", r.sleep)
	case n < 86:
		unlessSkipped("override", r.override)
	case n < 90:
		unlessSkipped("reset", r.reset)
	case n < 93:
		unlessSkipped("race", r.race)
	case n < 96:
		unlessSkipped("reload", r.reload)
	default:
		r.quiet("quiet point")
	}
}

// unlessSkipped runs step unless the schedule skips steps of kind.
func unlessSkipped(kind string, step func()) {
	if !hmSkips(kind) {
		step()
	}
}

// newRequest draws a request of route z's path on a random instance.
func (r *hmRun) newRequest(z *hmZone) hmRequest {
	q := hmRequest{route: routeOf(z), inst: r.rng.IntN(hmInstances), key: r.keys[r.rng.IntN(len(r.keys))], status: http.StatusOK}
	if z == hmCW && !hmSkips("tier") && r.rng.IntN(4) == 0 {
		q.plan = "pro"
	}
	// The least quota of the route's zones that read X-Cost.
	quota := int64(1 << 40)
	for _, zz := range hmRoutes[q.route] {
		if l := r.m.limitFor(r.inst[q.inst], zz, q.key, q.plan); zz.costly && l.action == "limit" {
			quota = min(quota, l.quota)
		}
	}
	if quota == 1<<40 {
		quota = r.inst[q.inst].cfg.events[z.id]
	}
	quota = max(1, quota)
	q.cost = 1
	if z.costly {
		q.cost = 1 + r.rng.Int64N(quota)
		switch n := r.rng.IntN(24); {
		case n < 4 && !hmSkips("cost0"):
			q.cost = 0
		case n == 4 && !hmSkips("badcost") && z != hmLB:
			// More than the limit in force can ever admit: refused
			// with 400, consuming nothing (docs/shaped-limits.md,
			// "Costs from the request").
			q.cost = quota + 1
		}
	}
	if z.counts && r.rng.IntN(3) == 0 {
		q.status = []int{http.StatusForbidden, http.StatusInternalServerError, http.StatusUnauthorized}[r.rng.IntN(3)]
	}
	if z.charges && !hmSkips("charge") && r.rng.IntN(2) == 0 {
		switch n := r.rng.IntN(10); {
		case n == 0:
			q.used = "lots"
		case n == 1:
			q.used = strconv.FormatInt(quota+1+r.rng.Int64N(5), 10)
		default:
			q.used = strconv.FormatInt(r.rng.Int64N(quota+1), 10)
		}
		q.trailer = !hmSkips("trailer") && r.rng.IntN(2) == 0
	}
	if !hmSkips("panic") && z != hmLB && r.rng.IntN(12) == 0 {
		if r.rng.IntN(2) == 0 {
			q.panicBefore = true
		} else {
			q.panicAfter = true
		}
	}
	if z == hmLB && !hmSkips("leave") && r.rng.IntN(3) == 0 {
		q.leave = true
	}
	if !q.leave && !hmSkips("gone") && slices.ContainsFunc(hmRoutes[q.route], func(z *hmZone) bool { return z.redis }) && r.rng.IntN(16) == 0 {
		q.gone = true
	}
	return q
}

// request runs one request of z's route: to its end, or, for a
// concurrency zone, until it is decided, leaving it in flight. A route
// with a zone that passes requests on over its limit (hmRun.passes) gets
// a second request at once, so that the zone is found over its limit
// more often.
func (r *hmRun) request(z *hmZone) {
	r.send(r.newRequest(z))
	if slices.ContainsFunc(hmRoutes[routeOf(z)], func(z *hmZone) bool { return r.passes[z.id] }) && r.failure == "" {
		r.send(r.newRequest(z))
	}
}

// send runs q as request does, and reports whether it was admitted.
func (r *hmRun) send(q hmRequest) bool {
	lims := r.limits(q)
	hold := slices.ContainsFunc(hmRoutes[q.route], func(z *hmZone) bool { return z.alg == "concurrency" })
	f := r.start(q, hold)
	if q.leave {
		if !r.wait(f.decided, "deciding "+q.String()) {
			return false
		}
		f.cancel()
	}
	if hold {
		if !r.wait(f.entered, "deciding "+q.String()) {
			return false
		}
		if f.called.Load() {
			r.logf("in flight: %s", q)
			r.m.decide(f, r.recheck(q, lims))
			r.flights = append(r.flights, f)
			return true
		}
	}
	if !r.wait(f.done, "serving "+q.String()) {
		return false
	}
	r.logf("%s: %d (called %v, panicked %v)", q, f.status, f.called.Load(), f.panicked)
	// A zone whose key is exempt decides nothing and waits for no store
	// (ambiguous: the model cannot tell).
	asksRemote := false
	for i, zz := range hmRoutes[q.route] {
		asksRemote = asksRemote || zz.redis && lims[i].action != "exempt" && lims[i].action != "ambiguous"
	}
	if q.gone && asksRemote && (f.called.Load() || !slices.Contains([]int{statusClientClosedRequest, http.StatusTooManyRequests, http.StatusBadRequest}, f.status)) {
		r.fail("%s: status %d (called %v); a client gone before its remote zone decided wants 499, or the 429 or 400 of a zone before it, never next", q, f.status, f.called.Load())
		return false
	}
	if f.panicked != (f.called.Load() && (q.panicBefore || q.panicAfter)) {
		r.fail("%s: ServeHTTP panicked %v, want the panic of next re-raised", q, f.panicked)
		return false
	}
	for i, zz := range hmRoutes[q.route] {
		if zz.costly && q.cost > lims[i].quota && lims[i].action == "limit" && f.status != http.StatusBadRequest && !f.called.Load() && f.status != http.StatusTooManyRequests {
			r.fail("%s: status %d, want 400 for a cost above zone %s's quota %d", q, f.status, zz.id, lims[i].quota)
			return false
		}
		if zz.costly && q.cost > lims[i].quota && lims[i].action == "limit" && f.called.Load() {
			r.fail("%s: admitted with a cost above zone %s's quota %d", q, zz.id, lims[i].quota)
			return false
		}
	}
	r.m.decide(f, r.recheck(q, lims))
	if f.called.Load() || f.status == statusClientClosedRequest {
		r.noteFeatures(q, f)
	}
	r.m.settle(f)
	f.cancel()
	return f.called.Load()
}

// regionBurst sends four to eight requests of one key of a zone with
// `global` from instances drawn at random, so that the regions compete
// for the key's units, refill from global and their batches grow. In
// half the bursts, when the redis window ends within hmRegionEdge, the
// burst waits for its end half way: units a region took in one window
// must not be spent in the next (a batch lapses at its window's end),
// where global grants the limit afresh.
func (r *hmRun) regionBurst() {
	z := hmGlobalZones[r.rng.IntN(len(hmGlobalZones))]
	key := r.keys[r.rng.IntN(len(r.keys))]
	edge := r.rng.IntN(2) == 0
	n := 4 + r.rng.IntN(5)
	for i := range n {
		if r.failure != "" {
			return
		}
		if i == n/2 && edge {
			w := r.inst[0].cfg.redisWindow.Microseconds()
			now := time.Now().UnixMicro()
			if end := (now/w + 1) * w; end-now < hmRegionEdge.Microseconds() {
				time.Sleep(time.Duration(end-now+500) * time.Microsecond)
				r.features["regions-edge"] = true
				r.logf("regions: slept to the redis window's end")
			}
		}
		q := r.newRequest(z)
		q.key = key
		r.send(q)
	}
}

// hmRegionEdge: a burst of regionBurst waits for the redis window's end
// when it comes within this.
const hmRegionEdge = 40 * time.Millisecond

// hmEdgeOdds: a schedule that mixes clocks takes an edge step at one
// step in hmEdgeOdds; each sleeps about half a redis window.
const hmEdgeOdds = 120

// edge tries what docs/redis.md ("Servers that refuse TIME in scripts",
// "What that costs") says skew δ costs a fixed window at its edge: the
// instance whose clock is ahead fills a key of rf just before its window
// ends on that clock, and once it has ended there, but not on the clock
// δ behind (δ/2 later), the instance behind sends the same key. Its
// clock still says the window the other filled, whose key outlives it by
// a second: it must find it full (checkRedis holds each admission to the
// window its instance's clock allows).
func (r *hmRun) edge() {
	key := r.keys[r.rng.IntN(len(r.keys))]
	ahead, behind := 1, 0
	if r.skew > 0 {
		ahead, behind = 0, 1
	}
	w := r.inst[ahead].cfg.redisWindow.Microseconds()
	off := r.m.offset(hmRF, ahead)
	now := time.Now().UnixMicro()
	// end is when, in real time, the ahead clock's window ends.
	end := (floorDiv(now+off, w)+1)*w - off
	if end-now < (15 * time.Millisecond).Microseconds() {
		end += w
	}
	r.logf("edge: rf %s from instance %d, then from instance %d %v after the window's end on instance %d's clock", key, ahead, behind, r.skew.Abs()/2, ahead)
	r.features["edge"] = true
	for range r.inst[ahead].cfg.events[hmRF.id] + 1 {
		if time.Now().UnixMicro() >= end-(2*time.Millisecond).Microseconds() {
			break
		}
		if !r.send(hmRequest{route: hmRF.id, inst: ahead, key: key, cost: 1, status: http.StatusOK}) || r.failure != "" {
			break
		}
	}
	time.Sleep(time.Until(time.UnixMicro(end).Add(r.skew.Abs() / 2)))
	for range 2 {
		if r.failure != "" {
			return
		}
		r.send(hmRequest{route: hmRF.id, inst: behind, key: key, cost: 1, status: http.StatusOK})
	}
}

// limits are the limits in force for q in each zone of its route.
func (r *hmRun) limits(q hmRequest) []hmLimit {
	var lims []hmLimit
	for _, z := range hmRoutes[q.route] {
		lims = append(lims, r.m.limitFor(r.inst[q.inst], z, q.key, q.plan))
	}
	return lims
}

// recheck compares the limits in force for q once it was decided with
// lims, those before it was sent: a redis zone's clock runs on meanwhile,
// and an override that lapsed in between leaves the limit that decided
// unknown (ambiguous: its admission is not counted, and the states are
// not compared).
func (r *hmRun) recheck(q hmRequest, lims []hmLimit) []hmLimit {
	after := r.limits(q)
	for i := range lims {
		if after[i] != lims[i] {
			r.m.ambiguous[lims[i].state], r.m.ambiguous[after[i].state] = true, true
			lims[i] = hmLimit{action: "ambiguous"}
		}
	}
	return lims
}

// noteFeatures notes what an admitted request exercised.
func (r *hmRun) noteFeatures(q hmRequest, f *hmFlight) {
	switch {
	case q.leave && f.status == statusClientClosedRequest:
		r.features["leave"], r.features["hold"] = true, true
	case q.route == hmLB.id:
		r.features["hold"] = true
	}
	if q.gone && f.status == statusClientClosedRequest {
		r.features["gone"] = true
	}
	if q.used != "" {
		r.features["charge"] = true
		if q.trailer {
			r.features["trailer"] = true
		}
	}
	if q.status != http.StatusOK {
		r.features["uncounted"] = true
	}
	if q.panicBefore || q.panicAfter {
		r.features["panic"] = true
	}
	if q.plan != "" {
		r.features["tier"] = true
	}
	if q.cost == 0 {
		r.features["cost0"] = true
	}
	if r.mixed && q.inst == 0 && hmRoutes[q.route][0].kind() == hmRedis {
		r.features["mixed"] = true
	}
}

// clockStep moves the test's clock forward, and the redis handlers'
// with it (Redis's TIME is real time: see sleep).
func (r *hmRun) clockStep() {
	cw := r.inst[0].cfg.cwWindow
	d := []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond, time.Second, 1500 * time.Millisecond, cw}[r.rng.IntN(6)]
	r.clock.Advance(d)
	r.rclock.offset.Add(int64(d))
	if d >= cw && r.resetSeen {
		r.features["refill"] = true
	}
	r.logf("clock +%v", d)
}

// sleep lets real time pass, Redis's TIME, so redis zones refill and
// cross window edges: up to a redis window.
func (r *hmRun) sleep() {
	w := r.inst[0].cfg.redisWindow
	d := w/8 + time.Duration(r.rng.Int64N(int64(w/2)))
	time.Sleep(d)
	if r.resetSeen {
		r.features["refill"] = true
	}
	r.logf("slept %v", d.Round(time.Millisecond))
}

// override PUTs or DELETEs a key's override through the admin API, or
// (a third of the time, not in a concurrency zone, unless "prefix" is
// skipped) a prefix's: "k", which every key of the model starts with, or
// a whole key as a prefix, which a key's own override beats.
func (r *hmRun) override() {
	var zs []*hmZone
	for _, z := range r.zones() {
		if z.overrides {
			zs = append(zs, z)
		}
	}
	z := zs[r.rng.IntN(len(zs))]
	in := r.inst[r.rng.IntN(hmInstances)]
	key := r.keys[r.rng.IntN(len(r.keys))]
	name := r.name(z, in.i)
	if z.alg == "concurrency" && r.inFlight(name, key) {
		if hmSkips("ovconc") {
			return
		}
		r.features["ovconc"] = true
	}
	now := r.nowFor(z)
	query, what := url.Values{"key": {key}}.Encode(), key
	if z.alg != "concurrency" && !hmSkips("prefix") && r.rng.IntN(3) == 0 {
		p := []string{"k", key}[r.rng.IntN(2)]
		query, what = prefixQuery(p), hmPrefixMark+p
		r.features["prefix"] = true
	}
	old := r.m.overrides[name+"|"+what]
	if old != nil && (!old.active(now) || r.rng.IntN(3) == 0) {
		// An override lapsed on the test's clock may still stand on the
		// admin API's (real time, behind it): delete it, so a PUT starts
		// afresh as the model says.
		if code, body := pxAdmin(r.t, http.MethodDelete, name, query, ""); code != http.StatusOK {
			r.fail("DELETE override %s %s: %d %s", name, query, code, body)
			return
		}
		delete(r.m.overrides, name+"|"+what)
		r.logf("override %s %s deleted", name, query)
		return
	}
	o := &hmOverride{action: "limit"}
	events := in.cfg.events[z.id]
	o.n = 1 + r.rng.Int64N(2*events)
	if z.alg == "concurrency" {
		o.n = 1 + r.rng.Int64N(3)
	} else if n := r.rng.IntN(6); n == 0 {
		o.action = "block"
	} else if n == 1 {
		o.action = "exempt"
	}
	body := fmt.Sprintf(`{"limit": %d`, o.n)
	if o.action != "limit" {
		body = fmt.Sprintf(`{"action": %q`, o.action)
	}
	// A concurrency override that lapses while its key's requests run
	// changes the limit in force under them, as a PUT does ("ovconc"):
	// "concexpiry" leaves such expiries out.
	if !hmSkips("expiry") && !(z.alg == "concurrency" && hmSkips("concexpiry")) && r.rng.IntN(3) == 0 {
		d := []time.Duration{300 * time.Millisecond, time.Second, 3 * time.Second}[r.rng.IntN(3)]
		o.expires = (now + d.Microseconds()) / 1000 * 1000
		body += fmt.Sprintf(`, "expires": %q`, time.UnixMicro(o.expires).UTC().Format(time.RFC3339Nano))
		r.features["expiry"] = true
	}
	body += "}"
	// keepGen: the same limit over one in force keeps its state.
	if old != nil && old.active(now) && old.action == "limit" && o.action == "limit" && old.n == o.n {
		o.gen = old.gen
	} else {
		r.m.gen++
		o.gen = r.m.gen
	}
	if code, resp := pxAdmin(r.t, http.MethodPut, name, query, body); code != http.StatusOK {
		r.fail("PUT override %s %s %s: %d %s", name, query, body, code, resp)
		return
	}
	r.m.overrides[name+"|"+what] = o
	if z.global {
		r.features["regions-override"] = true
	}
	r.logf("override %s %s: %s (gen %d)", name, query, body, o.gen)
}

// inFlight reports whether requests of key are in flight in zone name.
func (r *hmRun) inFlight(name, key string) bool {
	for _, f := range r.flights {
		for _, a := range f.adms {
			if a.key == key && r.name(a.z, a.inst) == name {
				return true
			}
		}
	}
	return false
}

// resetZones are the zones admin resets are sent to: not concurrency's,
// whose state is the requests in flight; with regions, gf and gt too.
var resetZones = []*hmZone{hmCW, hmLC, hmLB, hmML, hmMT, hmWF, hmRF, hmRL, hmRT, hmRW}

// zones are the schedule's zones: every instance's, and with regions the
// zones with `global`.
func (r *hmRun) zones() []*hmZone {
	if !r.regions {
		return hmAllZones
	}
	return append(hmAllZones[:len(hmAllZones):len(hmAllZones)], hmGlobalZones...)
}

// reset forgets a key's state through the admin API (admin.go resetKey):
// its zone's own limit's and its override's in force. For a zone with
// `global`, every instance's zone of the name answers: each forgets its
// region's pool and global's state (regional.Store.Reset), so both
// regions and global start afresh.
func (r *hmRun) reset() {
	zs := resetZones
	if r.regions {
		zs = append(zs[:len(zs):len(zs)], hmGlobalZones...)
	}
	z := zs[r.rng.IntN(len(zs))]
	in := r.inst[r.rng.IntN(hmInstances)]
	key := r.keys[r.rng.IntN(len(r.keys))]
	states := r.resetStates(z, in, key)
	if code, body := adminReset(r.t, r.name(z, in.i), key); code != http.StatusOK {
		r.fail("DELETE %s %s: %d %s", r.name(z, in.i), key, code, body)
		return
	}
	for _, s := range states {
		r.m.resetState(s)
	}
	r.resetSeen = true
	r.features["reset"] = true
	if z.global {
		r.features["regions-reset"] = true
	}
	r.logf("reset %s %s: %v", r.name(z, in.i), key, states)
}

// resetStates are the states a reset of key in z through in's name
// starts afresh: on each instance the name reaches, the zone's own
// limit's and the override's in force.
func (r *hmRun) resetStates(z *hmZone, in *hmInstance, key string) []string {
	now := r.nowFor(z)
	var states []string
	for _, other := range r.inst {
		if !z.redis && other != in {
			continue
		}
		for _, ov := range []bool{false, true} {
			l := r.m.limitAt(other, z, key, "", now)
			if !ov {
				r.m.bare = true
				l = r.m.limitAt(other, z, key, "", now)
				r.m.bare = false
			}
			if l.action == "limit" && !slices.Contains(states, l.state) {
				states = append(states, l.state)
			}
		}
	}
	return states
}

// busy sends requests of one key of a leased redis zone (a zone with
// global among them when its schedule leases there) from one instance,
// one after another, as a busy client does: the key's leases come in a
// row and grow, and once it is low the instance refills it ahead in the
// background while the requests spend it (docs/near-cache.md).
func (r *hmRun) busy() {
	zs := []*hmZone{hmRF, hmRL, hmRT}
	if r.regionLease {
		// The zones with global lease from their region's units, and
		// refill ahead from them too.
		zs = append(zs, hmGlobalZones...)
	}
	z := zs[r.rng.IntN(len(zs))]
	q := hmRequest{route: routeOf(z), inst: r.rng.IntN(hmInstances), key: r.keys[r.rng.IntN(len(r.keys))], cost: 1, status: http.StatusOK}
	for range 5 + r.rng.IntN(8) {
		r.send(q)
		if r.failure != "" {
			return
		}
	}
	r.features["busy"] = true
	if z.global {
		r.features["busy-regions"] = true
	}
}

// race sends requests of one key of a leased redis zone (with regions,
// or a zone with `global`: refills of the regions' batches) from every
// instance while an admin reset of the key runs: a reset with lease
// refills in flight.
func (r *hmRun) race() {
	zs := []*hmZone{hmRF, hmRL, hmRT}
	if r.regions {
		zs = append(zs, hmGlobalZones...)
	}
	z := zs[r.rng.IntN(len(zs))]
	key := r.keys[r.rng.IntN(len(r.keys))]
	before := r.resetStates(z, r.inst[0], key)
	var flights []*hmFlight
	var lims [][]hmLimit
	n := 6 + r.rng.IntN(7)
	var resetLo, resetHi int64
	var wg sync.WaitGroup
	wg.Add(1)
	delay := time.Duration(r.rng.IntN(800)) * time.Microsecond
	code, body := 0, ""
	go func() {
		defer wg.Done()
		time.Sleep(delay)
		resetLo = time.Now().UnixMicro()
		code, body = adminReset(r.t, r.name(z, 0), key)
		resetHi = time.Now().UnixMicro()
	}()
	for i := range n {
		q := hmRequest{route: z.id, inst: i % hmInstances, key: key, cost: 1, status: http.StatusOK}
		lims = append(lims, []hmLimit{r.m.limitFor(r.inst[q.inst], z, key, "")})
		flights = append(flights, r.start(q, false))
	}
	wg.Wait()
	for _, f := range flights {
		if !r.wait(f.done, "serving "+f.q.String()) {
			return
		}
	}
	if code != http.StatusOK {
		r.fail("race: DELETE %s %s: %d %s", r.name(z, 0), key, code, body)
		return
	}
	for _, s := range before {
		r.m.resetState(s)
		r.m.raced[stateBase(s)] = true
	}
	r.resetSeen = true
	r.features["race"], r.features["reset"] = true, true
	if z.global {
		r.features["regions-race"] = true
	}
	r.m.pending = flights
	defer func() { r.m.pending = nil }()
	for i, f := range flights {
		l := lims[i][0]
		switch {
		case f.realEnd < resetLo: // before the reset: its state's old epoch
		case f.realStart > resetHi:
			l = r.m.limitFor(r.inst[f.q.inst], z, key, "")
		default:
			r.m.ambiguous[l.state] = true
			l.state = ""
			r.m.ambiguous[r.m.limitFor(r.inst[f.q.inst], z, key, "").state] = true
		}
		if after := r.m.limitFor(r.inst[f.q.inst], z, key, ""); l.state != "" && l.action != after.action {
			l = hmLimit{action: "ambiguous"}
		}
		r.logf("race: %s: %d (state %q)", f.q, f.status, l.state)
		r.m.decide(f, []hmLimit{l})
		r.m.settle(f)
	}
	r.logf("race: reset %s %s in [%d, %d]µs real", z.id, key, resetLo%1e6, resetHi%1e6)
}

// reload gives an instance a new handler, as a config reload does: with
// the same limits, or with one zone's changed.
func (r *hmRun) reload() {
	in := r.inst[r.rng.IntN(hmInstances)]
	cfg := in.cfg.clone()
	what := "same limits"
	if !hmSkips("change") && r.rng.IntN(2) == 0 {
		zs := []*hmZone{hmCW, hmLC, hmML, hmMT, hmWF, hmWC, hmCC, hmRC, hmRF, hmRT, hmRW}
		if r.regions {
			zs = append(zs, hmGlobalZones...)
		}
		z := zs[r.rng.IntN(len(zs))]
		if n := max(1, cfg.events[z.id]+[]int64{-1, 1}[r.rng.IntN(2)]); n != cfg.events[z.id] {
			cfg.events[z.id] = n
			cfg.changes[z.id]++
			what = fmt.Sprintf("zone %s events %d", z.id, n)
		}
	}
	for _, f := range r.flights {
		if f.q.inst == in.i {
			r.features["reload-inflight"] = true
		}
	}
	if err := r.provision(in, cfg); err != nil {
		r.fail("reload of instance %d: %v", in.i, err)
		return
	}
	if r.regions {
		r.features["regions-reload"] = true
	}
	r.logf("reload instance %d: %s", in.i, what)
}

// adminReset sends DELETE /rate_limit/zones/<name>?key=<key> (admin.go).
func adminReset(t *testing.T, name, key string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodDelete, adminPrefix+"zones/"+url.PathEscape(name)+"?key="+url.QueryEscape(key), nil)
	w := httptest.NewRecorder()
	if err := serveAdmin(w, req); err != nil {
		var ae caddy.APIError
		if errors.As(err, &ae) {
			return ae.HTTPStatus, ae.Message
		}
		return -1, err.Error()
	}
	return w.Code, w.Body.String()
}

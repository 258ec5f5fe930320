package ratelimit

import (
	"fmt"
	"strconv"
	"time"
)

// hmModel is the reference: what every admission took from which state,
// and what each state must hold.
//
// A state is named as the stores keep them apart (docs/operations.md,
// "State and reloads"; docs/admin-api.md, "Runtime overrides"): a zone (a memory zone's name is its
// instance's), its limit (the zone's own events, a tier's, or an
// override's generation), the key, and the epoch (the admin resets of
// that state so far).
type hmModel struct {
	r         *hmRun
	overrides map[string]*hmOverride // by zone name and key, or hmPrefixMark and a prefix
	// bare makes limitAt leave overrides out: the zone's own limit.
	bare   bool
	gen    int
	epochs map[string]int
	// fw is the exact count of the memory fixed windows (cw, lc) per
	// state and aligned window, as fixedWindowState keeps it.
	fw   map[string]map[int64]int64
	adms []*hmAdm
	// charged is what charges took in each redis state beyond up-front
	// costs.
	charged map[string]int64
	// left are the states a client left while held in; raced the states
	// (without epoch) a race step reset: for failure messages.
	left  map[string]bool
	raced map[string]bool
	// ambiguous are the redis states a race step left unsure of: an
	// admission that overlapped the reset may be either epoch's.
	ambiguous map[string]bool
	// pending are requests that ran beside the one being decided and are
	// decided after it (a race step's): what they took is not recorded
	// yet, but they may have written a key first (hmModel.windowsOf).
	pending []*hmFlight
	// writers are the decided requests of redis zones, admitted or not
	// (a zone before the one that refused takes units that go back to
	// it or to its lease, which writes its key all the same), each as
	// far as it may have written a key: hmModel.windowsOf.
	writers []*hmWrite
}

// hmWrite is a decided request of a redis zone: its instance, the real
// time it started, and until, the real time it ended (0 in flight).
type hmWrite struct {
	z     *hmZone
	f     *hmFlight
	key   string
	inst  int
	lo    int64
	until int64
}

// hmOverride is a key's override as the model set it.
type hmOverride struct {
	action  string // limit, block, exempt
	n       int64
	expires int64 // the clock's µs; 0: none
	gen     int
}

func (o *hmOverride) active(now int64) bool { return o.expires == 0 || now < o.expires }

// hmAdm is one admission of one zone.
type hmAdm struct {
	id    int
	z     *hmZone
	inst  int
	key   string
	state string // "" when ambiguous between two epochs
	// load names a concurrency key's requests in flight: every limit of
	// the key (its overrides') shares them.
	load  string
	quota int64
	cost  int64
	// counted is what the store holds for it: the up-front cost until it
	// settles, then what settling left (what a charge takes beyond the
	// up-front cost is not counted: it only makes the store refuse more).
	counted int64
	// stored is what the store holds for it once settled, less what
	// charges took beyond the up-front cost (hmModel.charged).
	stored int64
	// at is the clock (µs) at the decision, for memory zones; lo and hi
	// bracket it in real time, Redis's TIME, for redis zones.
	at, lo, hi int64
	inflight   bool
	window     time.Duration
}

func newHMModel(r *hmRun) *hmModel {
	return &hmModel{r: r, overrides: map[string]*hmOverride{}, epochs: map[string]int{}, fw: map[string]map[int64]int64{}, charged: map[string]int64{}, left: map[string]bool{}, raced: map[string]bool{}, ambiguous: map[string]bool{}}
}

// hmLimit is the limit in force for a request in one zone.
type hmLimit struct {
	action string // limit, block, exempt
	state  string
	load   string
	quota  int64
	window time.Duration
}

// limitFor is the limit zone z applies on instance in to key with plan
// now (the clock's µs): the key's override in force, else the tier's,
// else the zone's own (docs/design.md "Runtime overrides: the adapter").
func (m *hmModel) limitFor(in *hmInstance, z *hmZone, key, plan string) hmLimit {
	return m.limitAt(in, z, key, plan, m.r.nowFor(z))
}

// limitAt is limitFor at now (the µs of z's handler's clock).
func (m *hmModel) limitAt(in *hmInstance, z *hmZone, key, plan string, now int64) hmLimit {
	name := m.r.name(z, in.i)
	events := in.cfg.events[z.id]
	l := hmLimit{action: "limit", quota: events, window: m.window(in, z)}
	id := fmt.Sprintf("base/%d", events)
	if !z.redis {
		id += fmt.Sprintf(".%d", in.cfg.changes[z.id])
	}
	l.load = name + "|" + id + "|" + key
	if z == hmLB {
		l.quota = hmLBBurst
	}
	if o := m.overrideOf(name, key, now); o != nil {
		l.action = o.action
		if o.action != "limit" {
			return l
		}
		l.quota, id = o.n, fmt.Sprintf("ov%d/%d", o.gen, o.n)
		if z.global {
			// Named by the limit alone (zone.overrideStateKey): the same
			// limit set again carries on its state.
			id = fmt.Sprintf("ov/%d", o.n)
		}
	} else if z == hmCW && plan == "pro" {
		l.quota, id = in.cfg.cwPro, fmt.Sprintf("pro/%d", in.cfg.cwPro)
	}
	base := name + "|" + id + "|" + key
	l.state = base + "#" + strconv.Itoa(m.epochs[base])
	return l
}

// hmPrefixMark starts the name a prefix override is kept under in
// hmModel.overrides: name|<mark><prefix>, which no key of the model has.
const hmPrefixMark = "\x00prefix\x00"

// overrideOf is the override in force for key in zone name at now, as
// zone.overrideOf resolves it: the key's own, else that of the longest of
// its prefixes that has one in force (a lapsed one gives way to the next
// shorter), else none. bare leaves every override out (resetStates).
func (m *hmModel) overrideOf(name, key string, now int64) *hmOverride {
	if m.bare {
		return nil
	}
	if o := m.overrides[name+"|"+key]; o != nil && o.active(now) {
		return o
	}
	for n := len(key); n > 0; n-- {
		if o := m.overrides[name+"|"+hmPrefixMark+key[:n]]; o != nil && o.active(now) {
			return o
		}
	}
	return nil
}

// offset is how far (µs) the clock instance inst's scripts of zone z
// decide by is from real time, Redis's TIME: the skew on instance 0's
// redis zones when the schedule mixes clocks, else none (the zones with
// `global` decide by their servers' TIME).
func (m *hmModel) offset(z *hmZone, inst int) int64 {
	if m.r.mixed && inst == 0 && z.kind() == hmRedis {
		return m.r.skew.Microseconds()
	}
	return 0
}

// window is the window of z's limits on in.
func (m *hmModel) window(in *hmInstance, z *hmZone) time.Duration {
	switch {
	case z.redis:
		return in.cfg.redisWindow
	case z == hmLB:
		return time.Second
	}
	return in.cfg.cwWindow
}

// stateBase is a state's name without its epoch.
func stateBase(state string) string {
	for i := len(state) - 1; i >= 0; i-- {
		if state[i] == '#' {
			return state[:i]
		}
	}
	return state
}

// resetState starts state afresh, as an admin reset does.
func (m *hmModel) resetState(state string) {
	m.epochs[stateBase(state)]++
}

// decide records what f's admission took in each zone of its route, and
// checks each against its limit. lims are the limits in force when f was
// decided (the clock did not move in between).
func (m *hmModel) decide(f *hmFlight, lims []hmLimit) {
	r := m.r
	for _, z := range hmRoutes[f.q.route] {
		if z.redis {
			m.writers = append(m.writers, &hmWrite{z: z, f: f, key: f.q.key, inst: f.q.inst, lo: f.realStart, until: f.realEnd})
		}
	}
	admitted := f.called.Load() || (f.q.leave && f.status == statusClientClosedRequest)
	if !admitted {
		r.refused++
		for i, z := range hmRoutes[f.q.route] {
			if lims[i].action == "exempt" && len(hmRoutes[f.q.route]) == 1 {
				r.fail("%s refused (%d) though its key is exempt in zone %s", f.q, f.status, z.id)
			}
		}
		return
	}
	r.admitted++
	now := r.clock.Now().UnixMicro()
	for i, z := range hmRoutes[f.q.route] {
		l := lims[i]
		switch l.action {
		case "exempt", "ambiguous":
			continue
		case "block":
			r.fail("%s admitted though its key is blocked in zone %s", f.q, z.id)
			return
		}
		cost := f.q.cost
		if !z.costly {
			cost = 1
		}
		if f.exceeded == r.name(z, f.q.inst) {
			m.passedOn(f, z, l, cost, now)
			continue
		}
		a := &hmAdm{id: len(m.adms), z: z, inst: f.q.inst, key: f.q.key, state: l.state, load: l.load, quota: l.quota,
			cost: cost, counted: cost, stored: cost, at: now, lo: f.realStart, hi: f.realEnd, window: l.window}
		if z.alg == "concurrency" {
			a.inflight = true
		}
		if f.realEnd == 0 { // still running: bracket it until now
			a.hi = time.Now().UnixMicro()
		}
		m.adms = append(m.adms, a)
		f.adms = append(f.adms, a)
		r.byZone[z.id]++
		m.checkAdmission(a, f)
	}
}

// passedOn checks a request zone z passed on over its limit l (`exceeded
// pass`): only a zone with the option does, and it takes nothing, so no
// admission is recorded (the stores' states, compared at quiet points,
// show whether it took any). A memory fixed window, counted exactly, must
// have had no room for the request's cost (at least one unit) at now.
func (m *hmModel) passedOn(f *hmFlight, z *hmZone, l hmLimit, cost, now int64) {
	r := m.r
	if !r.passes[z.id] {
		r.fail("%s passed on by zone %s, which refuses requests over its limit", f.q, z.id)
		return
	}
	r.passedOn[z.id]++
	r.features["pass"] = true
	if z.alg == "fixed_window" && !z.redis && l.state != "" {
		held := m.fwOf(l.state)[now/l.window.Microseconds()]
		if held+max(cost, 1) <= l.quota {
			r.fail("%s passed on by zone %s though its window held %d of %d units (state %s): a cost of %d (at least one unit) fitted", f.q, z.id, held, l.quota, l.state, cost)
		}
	}
}

// settle records what f's response left counted in each zone that
// admitted it (docs/shaped-limits.md, "Counting only some responses",
// "Costs from the response"), and checks the limits again.
func (m *hmModel) settle(f *hmFlight) {
	q := f.q
	left := q.leave && f.status == statusClientClosedRequest
	for _, w := range m.writers {
		if w.f == f {
			w.until = f.realEnd
		}
	}
	for _, a := range f.adms {
		before := a.counted
		switch {
		case a.z.alg == "concurrency":
			a.inflight, a.counted = false, 0
		case left:
			// A request aborted before any response matched nothing: a
			// count_response zone gives its units back; a leaky bucket
			// keeps its place (respond.go holdRequest).
			if a.z.counts {
				a.counted, a.stored = 0, 0
				m.left[a.state] = true
			}
		case a.z.counts && (q.panicBefore || q.status < 200 || q.status > 299):
			a.counted, a.stored = 0, 0
		case a.z.charges:
			final, ok := m.reported(q, a)
			if ok {
				a.counted, a.stored = min(a.cost, final), min(a.cost, final)
				if final > a.cost {
					m.charge(a, final-a.cost)
				}
			}
		}
		if a.z.alg == "fixed_window" && !a.z.redis {
			if back := before - a.counted; back > 0 && a.state != "" {
				win := a.at / a.window.Microseconds()
				m.fw[a.state][win] = max(0, m.fw[a.state][win]-back)
			}
		}
	}
	for _, a := range f.adms {
		if a.z.redis && a.state != "" {
			m.checkRedis(a.state, a.z)
		}
	}
}

// reported is the cost q's response reports to a's zone, capped at the
// quota, and whether it reports one: none when it is missing or not an
// integer from 0 up, or comes in a trailer after a panic (settle.go).
func (m *hmModel) reported(q hmRequest, a *hmAdm) (int64, bool) {
	if q.used == "" || q.panicBefore || (q.trailer && q.panicAfter) {
		return 0, false
	}
	v, err := strconv.ParseInt(q.used, 10, 64)
	if err != nil || v < 0 {
		return 0, false
	}
	return min(v, a.quota), true
}

// charge takes units more in a's memory fixed window, in the window the
// response ends in, up to twice the quota (limiter's
// fixedWindowState.charge: the key owes at most one quota). It lands in
// the key's state as it is when the response ends: after an admin reset,
// the fresh one (a request carries its state's name, not its epoch).
func (m *hmModel) charge(a *hmAdm, units int64) {
	base := stateBase(a.state)
	state := base + "#" + strconv.Itoa(m.epochs[base])
	if a.z.redis {
		m.charged[state] += units
		return
	}
	win := m.r.clock.Now().UnixMicro() / a.window.Microseconds()
	w := m.fwOf(state)
	w[win] = max(w[win], min(w[win]+units, 2*a.quota))
}

func (m *hmModel) fwOf(state string) map[int64]int64 {
	w := m.fw[state]
	if w == nil {
		w = map[int64]int64{}
		m.fw[state] = w
	}
	return w
}

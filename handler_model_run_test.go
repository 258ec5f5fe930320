package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// hmZone is one of the zones every instance declares. Memory zones are
// each instance's own (their names carry its number); redis zones are one
// name shared by every instance.
type hmZone struct {
	id    string // short name, also its route's path
	alg   string
	redis bool
	// charges, counts: the zone has response_cost, count_response.
	charges, counts bool
	// costly: the zone's cost is the request's X-Cost header.
	costly bool
	// overrides: the schedules PUT overrides for its keys.
	overrides bool
	// global: the zone's redis block has `global` (regions): each
	// instance decides it against its region's pool, in one of two
	// regional redis-servers, which refills from a global one.
	global bool
}

// The zones, by route: /lb passes lc (count_response) and then lb (a
// leaky_bucket that holds), /wf passes wf (count_response and
// response_cost) and then wc (concurrency), so its requests stay in
// flight across steps and settle late, and /rw the same over Redis with
// leases (rw, then rc, which also decides /rc); every other route one
// zone of its name.
var (
	hmCW = &hmZone{id: "cw", alg: "fixed_window", charges: true, counts: true, costly: true, overrides: true}
	hmLC = &hmZone{id: "lc", alg: "fixed_window", counts: true}
	hmML = &hmZone{id: "ml", alg: "sliding_window_log", counts: true, costly: true, overrides: true}
	hmMT = &hmZone{id: "mt", alg: "token_bucket", charges: true, costly: true, overrides: true}
	hmLB = &hmZone{id: "lb", alg: "leaky_bucket"}
	hmWF = &hmZone{id: "wf", alg: "fixed_window", charges: true, counts: true, costly: true, overrides: true}
	hmWC = &hmZone{id: "wc", alg: "concurrency"}
	hmCC = &hmZone{id: "cc", alg: "concurrency", costly: true, overrides: true}
	hmRC = &hmZone{id: "rc", alg: "concurrency", redis: true, costly: true, overrides: true}
	hmRF = &hmZone{id: "rf", alg: "fixed_window", redis: true, counts: true, costly: true, overrides: true}
	hmRL = &hmZone{id: "rl", alg: "sliding_window_log", redis: true, overrides: true}
	hmRW = &hmZone{id: "rw", alg: "fixed_window", redis: true, charges: true, counts: true, costly: true, overrides: true}
	hmRT = &hmZone{id: "rt", alg: "token_bucket", redis: true, charges: true, costly: true, overrides: true}

	hmRoutes = map[string][]*hmZone{
		"cw": {hmCW}, "lb": {hmLC, hmLB}, "ml": {hmML}, "mt": {hmMT}, "wf": {hmWF, hmWC}, "cc": {hmCC}, "rc": {hmRC},
		"rf": {hmRF}, "rl": {hmRL}, "rt": {hmRT}, "rw": {hmRW, hmRC},
	}
	hmAllZones = []*hmZone{hmCW, hmLC, hmLB, hmML, hmMT, hmWF, hmWC, hmCC, hmRC, hmRF, hmRL, hmRT, hmRW}

	// The zones with `global` (docs/regions.md), in the schedules with
	// regions only, each on a route of its own and in a rate_limit of its
	// own (the redis block's global applies to all of its zones): gf, a
	// fixed window whose requests may not count (count_response), and
	// gt, a token bucket whose responses report their cost
	// (response_cost). Overrides are kept in each region's Redis and
	// a reset forgets the pool of the region of the instance it reaches,
	// besides global; but this process's admin API answers for every
	// instance's zone of the name, so a PUT reaches both regions' sets
	// and a reset both pools: the model's states stay one per zone,
	// limit and key.
	hmGF          = &hmZone{id: "gf", alg: "fixed_window", redis: true, global: true, counts: true, costly: true, overrides: true}
	hmGT          = &hmZone{id: "gt", alg: "token_bucket", redis: true, global: true, charges: true, costly: true, overrides: true}
	hmGlobalZones = []*hmZone{hmGF, hmGT}
)

func init() {
	for _, z := range hmGlobalZones {
		hmRoutes[z.id] = []*hmZone{z}
	}
}

// hmRegions are the servers of the schedules with regions: global, and
// a Redis per region. Instance i is in region i % 2.
type hmRegions struct {
	global *redistest.Server
	region [2]*redistest.Server
}

const (
	// hmLBRate and hmLBBurst are the leaky bucket's: 20/s, so a hold is
	// at most (burst − 1)/rate = 100ms of real time.
	hmLBRate  = 20
	hmLBBurst = 3
	// hmLocalQuota is the leased redis zones' local_quota.
	hmLocalQuota = 0.5
)

// hmConfig is one instance's limits: events per zone, and the memory
// zones' window (cwWindow) and cw's pro tier.
type hmConfig struct {
	events   map[string]int64
	cwWindow time.Duration
	cwPro    int64
	// redisWindow is the redis zones' (but concurrency's): real time,
	// Redis's TIME, which the schedule passes by sleeping.
	redisWindow time.Duration
	// changes counts the reloads that changed a memory zone's limit: each
	// starts its counters afresh, even back to a limit it had before,
	// since the pool lets go of a store no handler holds (docs/operations.md,
	// "State and reloads"); Redis keeps a limit's state by its policy.
	changes map[string]int
}

func (c hmConfig) clone() hmConfig {
	n := c
	n.events, n.changes = map[string]int64{}, map[string]int{}
	for k, v := range c.events {
		n.events[k] = v
	}
	for k, v := range c.changes {
		n.changes[k] = v
	}
	return n
}

// hmInstance is one instance: its handlers of the running config, one
// for the routes of its memory zones on the test's clock, one for those
// of its redis zones on hmRealClock (two rate_limit directives of one
// site, as Caddy allows).
type hmInstance struct {
	i     int
	h, hr *Handler
	// hg is the handler of the zones with `global`, in schedules with
	// regions (nil otherwise): on hmRealClock, its redis block its
	// region's server with the global one.
	hg  *Handler
	cfg hmConfig
	// cancel ends the handlers' Caddy context once they are cleaned up.
	cancel context.CancelFunc
	// url is its redis block's URL.
	url string
	// cleaned is set once its running handler is cleaned up.
	cleaned bool
}

// hmRun is one schedule.
type hmRun struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	srv    *redistest.Server
	rs     *hmRegions
	totals *hmTotals
	clock  *testutil.Clock
	// rclock is the redis handlers' clock: real time plus every step of
	// clock. Redis's TIME is real time, so their leases must not outlive
	// it (docs/near-cache.md: a lease lives a second), and
	// override expiries on it can fall within a request.
	rclock *hmRealClock
	prefix string
	mixed  bool
	// skew is how far instance 0's own clock, the one its scripts decide
	// by when r.mixed, is from Redis's TIME (real time): negative behind,
	// positive ahead; 0 unless r.mixed. Its redis admissions, timed in
	// real time like the others', happened at real time plus skew on the
	// clock the scripts read (hmModel.offset).
	skew    time.Duration
	inst    []*hmInstance
	cleanup []func()
	keys    []string
	m       *hmModel
	flights []*hmFlight
	step    int
	steps   int
	log     []string
	failure string
	// features are what the schedule did, for the totals' mixes.
	features          map[string]bool
	admitted, refused int
	// passes are the zones (by id) that pass a request over their limit
	// on (`exceeded pass`) in this schedule, each in half the schedules:
	// cw, alone on its route (with tiers and overrides), lb, before lc
	// on its route (zones are decided in name order), which then counts
	// what lb passed on, and rw, after the concurrency zone rc, over
	// Redis with leases; passedOn counts the requests each passed on.
	passes   map[string]bool
	passedOn map[string]int
	// regions: the schedule has the zones with `global` (hmGlobalZones),
	// in half the schedules, their instances in two regions; regionLease
	// gives them local_quota (in half of those); regionQuota is their
	// global block's region_quota.
	regions, regionLease bool
	regionQuota          float64
	byZone               map[string]int
	resetSeen            bool
	// reclaimsCounted: countReclaims ran.
	reclaimsCounted bool
	// compared counts the states compared with the stores at quiet
	// points, and at the end in Redis.
	compared, comparedRedis int
}

var hmSeq atomic.Int64

// hmRealClock is real time plus an offset that only grows.
type hmRealClock struct{ offset atomic.Int64 }

func (c *hmRealClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// hmSkewClock is real time, Redis's TIME, moved by d: the clock instance
// 0's scripts read when r.mixed, as a host whose clock is d from the
// server's.
type hmSkewClock struct{ d time.Duration }

func (c hmSkewClock) Now() time.Time { return time.Now().Add(c.d) }

// Skews are drawn from hmSkewMin up to hmSkewMax, and below
// hmSkewPerWindow of the redis window, well inside the second docs/redis.md
// ("Servers that refuse TIME in scripts") bounds skew to.
const (
	hmSkewMin       = 20 * time.Millisecond
	hmSkewMax       = 150 * time.Millisecond
	hmSkewPerWindow = 0.75
)

// drawSkew draws the schedule's skew for a redis window w: 20ms up to
// 150ms or 3/4 of w, behind or ahead of Redis's TIME.
func (r *hmRun) drawSkew(w time.Duration) time.Duration {
	hi := min(hmSkewMax, time.Duration(float64(w)*hmSkewPerWindow))
	d := hmSkewMin + time.Duration(r.rng.Int64N(int64(hi-hmSkewMin)+1)).Truncate(time.Millisecond)
	if r.rng.IntN(2) == 0 {
		return -d
	}
	return d
}

// nowFor is the time (µs) zone z's handler reads.
func (r *hmRun) nowFor(z *hmZone) int64 {
	if z.redis {
		return r.rclock.Now().UnixMicro()
	}
	return r.clock.Now().UnixMicro()
}

// timeFor is nowFor as a time.
func (r *hmRun) timeFor(z *hmZone) time.Time {
	if z.redis {
		return r.rclock.Now()
	}
	return r.clock.Now()
}

func newHMRun(t *testing.T, seed uint64, srv *redistest.Server, rs *hmRegions, totals *hmTotals) *hmRun {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	// Somewhere in a window, on a clock of its own ahead of real time
	// (a memory zone's state is the clock's; Redis's is real time).
	start := time.Now().Add(time.Duration(1+rng.IntN(3600)) * time.Second).Truncate(time.Microsecond)
	r := &hmRun{
		t: t, seed: seed, rng: rng, srv: srv, rs: rs, totals: totals,
		clock:    testutil.NewClock(start),
		rclock:   &hmRealClock{},
		prefix:   fmt.Sprintf("hm%d_", hmSeq.Add(1)),
		keys:     []string{"k0", "k1", "k2"}[:2+rng.IntN(2)],
		features: map[string]bool{},
		byZone:   map[string]int{},
		passedOn: map[string]int{},
		steps:    hmFlags.Steps(),
	}
	r.mixed = !hmSkips("mixed") && rng.IntN(2) == 0
	// From the seed's bits, not rng, so that a schedule draws its steps
	// as it did before zones could pass requests on.
	r.passes = map[string]bool{
		hmCW.id: !hmSkips("pass") && seed>>1&1 == 1,
		hmLB.id: !hmSkips("pass") && seed>>2&1 == 1,
		hmRW.id: !hmSkips("pass") && seed>>3&1 == 1,
	}
	r.regions = !hmSkips("regions") && seed>>4&1 == 1
	r.regionLease = r.regions && seed>>5&1 == 1
	r.m = newHMModel(r)
	return r
}

// name is a zone's name on instance i.
func (r *hmRun) name(z *hmZone, i int) string {
	if z.redis {
		return r.prefix + z.id
	}
	return fmt.Sprintf("%s%s_i%d", r.prefix, z.id, i)
}

func (r *hmRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf("step %3d clock +%.3fs: ", r.step, r.clockSince())+fmt.Sprintf(format, args...))
}

func (r *hmRun) clockSince() float64 {
	return float64(r.clock.Now().UnixMicro()%3_600_000_000) / 1e6
}

func (r *hmRun) fail(format string, args ...any) {
	if r.failure == "" {
		r.failure = fmt.Sprintf("step %d: ", r.step) + fmt.Sprintf(format, args...)
		r.logf("FAIL: %s", r.failure)
	}
}

// run runs the schedule and reports whether it held.
func (r *hmRun) run() bool {
	defer r.close()
	base := hmConfig{events: map[string]int64{}, changes: map[string]int{},
		cwWindow:    []time.Duration{time.Second, 2 * time.Second, 5 * time.Second}[r.rng.IntN(3)],
		redisWindow: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}[r.rng.IntN(3)]}
	for _, z := range hmAllZones {
		switch {
		case z == hmLB:
			base.events[z.id] = hmLBRate
		case z.alg == "concurrency":
			base.events[z.id] = 1 + r.rng.Int64N(3)
		default:
			base.events[z.id] = 2 + r.rng.Int64N(5)
		}
	}
	base.cwPro = base.events["cw"] * 2
	if r.mixed {
		r.skew = r.drawSkew(base.redisWindow)
		if r.skew < 0 {
			r.features["behind"] = true
		} else {
			r.features["ahead"] = true
		}
	}
	if r.regions {
		// Drawn after the rest, so that a schedule draws what it did before regions.
		for _, z := range hmGlobalZones {
			base.events[z.id] = 2 + r.rng.Int64N(5)
		}
		r.regionQuota = []float64{0.25, 0.5, 1}[r.rng.IntN(3)]
		r.features["regions"] = true
		r.features["regions-lease"] = r.regionLease
	}
	for i := range hmInstances {
		in := &hmInstance{i: i, url: "redis://" + r.srv.Addr()}
		if i == 0 && r.mixed {
			in.url = fmt.Sprintf("redis://%s:%s@%s", hmNoTimeUser, hmNoTimePassword, r.srv.Addr())
		}
		r.inst = append(r.inst, in)
	}
	for _, in := range r.inst {
		if err := r.provision(in, base.clone()); err != nil {
			r.t.Fatalf("seed %d: provisioning instance %d: %v", r.seed, in.i, err)
		}
	}
	if r.mixed {
		if z := r.zoneOf(r.inst[0], hmRF); !z.instanceClock() {
			r.t.Fatalf("seed %d: instance 0's redis zones are not on the instance's clock", r.seed)
		}
		if z := r.zoneOf(r.inst[1], hmRF); z.instanceClock() {
			r.t.Fatalf("seed %d: instance 1's redis zones are on the instance's clock", r.seed)
		}
	}
	r.logf("seed %d, mixed clocks %v (instance 0's skew %v), keys %v, limits %v, memory window %v, redis window %v, passing on %v, regions %v (region_quota %v, local_quota %v)", r.seed, r.mixed, r.skew, r.keys, base.events, base.cwWindow, base.redisWindow, r.passes, r.regions, r.regionQuota, r.regionLease)
	for r.step = 1; r.step <= r.steps && r.failure == ""; r.step++ {
		r.doStep()
	}
	if r.failure == "" {
		r.quiet("end of schedule")
	}
	if r.failure == "" {
		r.finalRedis()
	}
	r.totals.schedule(r)
	return r.failure == ""
}

// provision builds instance in's handlers of cfg, as a config load does,
// and makes them the ones new requests reach; those they replace are
// cleaned up at once, as Caddy does while their requests still run.
func (r *hmRun) provision(in *hmInstance, cfg hmConfig) error {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	var hs [3]*Handler
	kinds := []hmHandlerKind{hmMemory, hmRedis}
	if r.regions {
		kinds = append(kinds, hmGlobal)
	}
	for i, kind := range kinds {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(r.caddyfile(in, cfg, kind))); err != nil {
			cancel()
			return err
		}
		h.clock = r.clock
		if kind != hmMemory {
			h.clock = r.rclock
		}
		if err := h.Provision(ctx); err != nil {
			for _, p := range hs[:i] {
				_ = p.Cleanup()
			}
			cancel()
			return err
		}
		hs[i] = h
	}
	if in.i == 0 && r.mixed {
		// The redis block's pooled ServerClock: a reload with the same
		// block gets the same one, set again all the same.
		sc := hs[1].redis.clock
		if sc == nil {
			r.t.Fatalf("seed %d: instance 0's redis handler has no ServerClock", r.seed)
		}
		if in.hr != nil && in.hr.redis.clock != sc {
			r.logf("instance 0's reload got another ServerClock")
		}
		sc.SetInstanceClock(hmSkewClock{r.skew})
	}
	old, oldR, oldG, oldCancel := in.h, in.hr, in.hg, in.cancel
	in.h, in.hr, in.hg, in.cfg, in.cancel = hs[0], hs[1], hs[2], cfg, cancel
	if old != nil {
		_ = old.Cleanup()
		_ = oldR.Cleanup()
		if oldG != nil {
			_ = oldG.Cleanup()
		}
		r.cleanup = append(r.cleanup, oldCancel)
	}
	return nil
}

// hmHandlerKind is which of an instance's handlers: its memory zones',
// its redis zones', or its zones with `global`.
type hmHandlerKind int

const (
	hmMemory hmHandlerKind = iota
	hmRedis
	hmGlobal
)

func (z *hmZone) kind() hmHandlerKind {
	switch {
	case z.global:
		return hmGlobal
	case z.redis:
		return hmRedis
	}
	return hmMemory
}

// handler is in's running handler of z.
func (in *hmInstance) handler(z *hmZone) *Handler {
	switch z.kind() {
	case hmGlobal:
		return in.hg
	case hmRedis:
		return in.hr
	}
	return in.h
}

// caddyfile is instance in's rate_limit directive of its memory zones,
// of its redis zones, or of its zones with `global`.
func (r *hmRun) caddyfile(in *hmInstance, cfg hmConfig, kind hmHandlerKind) string {
	var b strings.Builder
	b.WriteString("rate_limit {\n")
	for _, z := range append(hmAllZones[:len(hmAllZones):len(hmAllZones)], hmGlobalZones...) {
		if z.kind() != kind {
			continue
		}
		fmt.Fprintf(&b, "\tzone %s {\n\t\tmatch {\n\t\t\tpath %s\n\t\t}\n", r.name(z, in.i), pathsOf(z))
		b.WriteString("\t\tkey {http.request.header.X-Key}\n")
		fmt.Fprintf(&b, "\t\talgorithm %s\n", z.alg)
		switch {
		case z == hmLB:
			fmt.Fprintf(&b, "\t\trate %d/1s\n\t\tburst %d\n", cfg.events[z.id], hmLBBurst)
		case z.alg == "concurrency":
			fmt.Fprintf(&b, "\t\tevents %d\n", cfg.events[z.id])
		case z.redis:
			fmt.Fprintf(&b, "\t\trate %d/%s\n", cfg.events[z.id], cfg.redisWindow)
		default:
			fmt.Fprintf(&b, "\t\trate %d/%s\n", cfg.events[z.id], cfg.cwWindow)
		}
		if z.costly {
			b.WriteString("\t\tcost {http.request.header.X-Cost}\n")
		}
		if z.counts {
			b.WriteString("\t\tcount_response {\n\t\t\tstatus 2xx\n\t\t}\n")
		}
		if z.charges {
			b.WriteString("\t\tresponse_cost X-Used\n")
		}
		if z == hmCW {
			fmt.Fprintf(&b, "\t\ttier {http.request.header.X-Plan} {\n\t\t\tpro %d/%s\n\t\t}\n", cfg.cwPro, cfg.cwWindow)
		}
		if r.passes[z.id] {
			b.WriteString("\t\texceeded pass\n")
		}
		if z.redis {
			b.WriteString("\t\tstore redis\n")
			if z.alg != "concurrency" && (!z.global || r.regionLease) {
				fmt.Fprintf(&b, "\t\tlocal_quota %v\n", hmLocalQuota)
			}
		}
		b.WriteString("\t}\n")
	}
	switch kind {
	case hmRedis:
		fmt.Fprintf(&b, "\tredis {\n\t\turl %s\n\t\ttimeout 5s\n\t}\n", in.url)
	case hmGlobal:
		// On Redis's TIME (the three servers share this machine's clock),
		// whatever instance 0's redis zones decide by.
		fmt.Fprintf(&b, "\tredis {\n\t\turl redis://%s\n\t\ttimeout 5s\n\t\tglobal {\n\t\t\turl redis://%s\n\t\t\tregion_quota %v\n\t\t\ttimeout 5s\n\t\t}\n\t}\n",
			r.rs.region[in.i%2].Addr(), r.rs.global.Addr(), r.regionQuota)
	}
	b.WriteString("}\n")
	return b.String()
}

// countReclaims adds the run's lease reclaims to the totals, once, while
// its handlers still declare their zones (the last Cleanup of a zone
// drops its series).
func (r *hmRun) countReclaims() {
	if r.reclaimsCounted {
		return
	}
	r.reclaimsCounted = true
	var asked, heard float64
	for _, z := range hmAllZones {
		if z.redis {
			asked += counterValue(r.t, metricFamilies.reclaims.WithLabelValues(r.name(z, 0), "asked"))
			heard += counterValue(r.t, metricFamilies.reclaims.WithLabelValues(r.name(z, 0), "heard"))
		}
	}
	r.totals.mu.Lock()
	r.totals.reclaimsAsked += asked
	r.totals.reclaimsHeard += heard
	r.totals.mu.Unlock()
}

// pathsOf are the paths whose requests z decides.
func pathsOf(z *hmZone) string {
	if z == hmRC {
		return "/rc /rw"
	}
	return "/" + routeOf(z)
}

// routeOf is the route z's requests are sent to.
func routeOf(z *hmZone) string {
	switch z {
	case hmLC:
		return hmLB.id
	case hmWC:
		return hmWF.id
	}
	return z.id
}

// zoneOf is z in instance in's running handler.
func (r *hmRun) zoneOf(in *hmInstance, z *hmZone) *zone {
	name := r.name(z, in.i)
	for _, zz := range in.handler(z).zones {
		if zz.name == name {
			return zz
		}
	}
	r.t.Fatalf("no zone %q", name)
	return nil
}

// close ends the schedule: every request still in flight finishes and
// every handler is cleaned up. Its zones' names are never used again.
func (r *hmRun) close() {
	r.finishAll()
	r.countReclaims()
	for _, in := range r.inst {
		if in.h != nil && !in.cleaned {
			_ = in.h.Cleanup()
			_ = in.hr.Cleanup()
			if in.hg != nil {
				_ = in.hg.Cleanup()
			}
		}
		if in.cancel != nil {
			in.cancel()
		}
	}
	for _, c := range r.cleanup {
		c()
	}
	// Memory zones' overrides live for the process, by name.
	for _, in := range r.inst {
		for _, z := range hmAllZones {
			if !z.redis {
				memoryOverrideSets.mu.Lock()
				delete(memoryOverrideSets.byName, r.name(z, in.i))
				memoryOverrideSets.mu.Unlock()
			}
		}
	}
}

// hmRequest is one request of a schedule and what the handler after the
// rate limit does with it.
type hmRequest struct {
	route string
	inst  int
	key   string
	cost  int64
	plan  string
	// status is what next answers; used, when set, the cost it reports
	// in the header (trailer unset) or in a trailer after the body.
	status  int
	used    string
	trailer bool
	// panicBefore and panicAfter make next panic before writing its
	// header or after its body.
	panicBefore, panicAfter bool
	// leave cancels the request's context once it is decided: a client
	// that leaves while a leaky bucket holds it.
	leave bool
	// gone cancels the request's context before it is sent: a client
	// that has left by the time a remote zone's decision comes back (a
	// Redis call runs to its answer whoever leaves), which ends the
	// request with 499 and gives back what every zone took.
	gone bool
}

func (q hmRequest) String() string {
	s := fmt.Sprintf("/%s i%d key=%s cost=%d", q.route, q.inst, q.key, q.cost)
	if q.plan != "" {
		s += " plan=" + q.plan
	}
	s += fmt.Sprintf(" status=%d", q.status)
	if q.used != "" {
		where := "header"
		if q.trailer {
			where = "trailer"
		}
		s += fmt.Sprintf(" used=%s(%s)", q.used, where)
	}
	if q.panicBefore {
		s += " panic-before-header"
	}
	if q.panicAfter {
		s += " panic-after-body"
	}
	if q.leave {
		s += " leaves"
	}
	if q.gone {
		s += " gone"
	}
	return s
}

// hmFlight is a request running on a goroutine.
type hmFlight struct {
	q hmRequest
	// decided is closed once the rate limit has decided it: its next
	// runs, its header is written (a refusal, or a hold about to begin),
	// or ServeHTTP returned.
	decided chan struct{}
	once    chanOnce
	// entered is closed once next runs or ServeHTTP returned: a request
	// held in flight is admitted or refused by then.
	entered     chan struct{}
	enteredOnce chanOnce
	// release lets next answer; done is closed when ServeHTTP returned.
	release chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
	// called is set when next ran; status is ServeHTTP's (an error's
	// status, or what next wrote), panicked whether it re-panicked.
	// exceeded is {http.rate_limit.exceeded.name} as next read it: the
	// zone that passed the request on over its limit, if one did.
	called    atomic.Bool
	exceeded  string
	status    int
	panicked  bool
	adms      []*hmAdm
	realStart int64
	realEnd   int64
}

// chanOnce closes a channel once.
type chanOnce struct{ closed atomic.Bool }

func (o *chanOnce) close(c chan struct{}) {
	if o.closed.CompareAndSwap(false, true) {
		close(c)
	}
}

// hmWriter is a ResponseRecorder that tells when the rate limit first
// touches the response's header: its decision is made by then.
type hmWriter struct {
	*httptest.ResponseRecorder
	f *hmFlight
}

func (w hmWriter) Header() http.Header {
	w.f.once.close(w.f.decided)
	return w.ResponseRecorder.Header()
}

// start runs q on its instance's handler on a goroutine; next waits for
// release when hold is set.
func (r *hmRun) start(q hmRequest, hold bool) *hmFlight {
	f := &hmFlight{q: q, decided: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	if !hold {
		close(f.release)
	}
	req := httptest.NewRequest(http.MethodGet, "http://example.com/"+q.route, nil)
	req.Header.Set("X-Key", q.key)
	req.Header.Set("X-Cost", fmt.Sprint(q.cost))
	if q.plan != "" {
		req.Header.Set("X-Plan", q.plan)
	}
	repl := caddyhttp.NewTestReplacer(req)
	ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "198.51.100.77"})
	ctx, f.cancel = context.WithCancel(ctx)
	if q.gone {
		f.cancel()
	}
	req = req.WithContext(ctx)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		f.exceeded, _ = repl.GetString("http.rate_limit.exceeded.name")
		f.called.Store(true)
		f.once.close(f.decided)
		f.enteredOnce.close(f.entered)
		<-f.release
		if q.panicBefore {
			panic(http.ErrAbortHandler)
		}
		if q.used != "" && !q.trailer {
			w.Header().Set("X-Used", q.used)
		}
		if q.used != "" && q.trailer {
			w.Header().Set("Trailer", "X-Used")
		}
		w.WriteHeader(q.status)
		_, _ = w.Write([]byte("ok"))
		if q.used != "" && q.trailer {
			w.Header().Set(http.TrailerPrefix+"X-Used", q.used)
		}
		if q.panicAfter {
			panic(http.ErrAbortHandler)
		}
		return nil
	})
	h := r.inst[q.inst].handler(hmRoutes[q.route][0])
	f.realStart = time.Now().UnixMicro()
	go func() {
		defer close(f.done)
		defer f.once.close(f.decided)
		defer f.enteredOnce.close(f.entered)
		defer func() { f.realEnd = time.Now().UnixMicro() }()
		defer func() {
			if p := recover(); p != nil {
				f.panicked = true
			}
		}()
		w := hmWriter{httptest.NewRecorder(), f}
		err := h.ServeHTTP(w, req, next)
		var he caddyhttp.HandlerError
		switch {
		case errors.As(err, &he):
			f.status = he.StatusCode
		case err != nil:
			f.status = -1
		default:
			f.status = w.Code
		}
	}()
	return f
}

// wait waits for c, failing the schedule after a while.
func (r *hmRun) wait(c chan struct{}, what string) bool {
	select {
	case <-c:
		return true
	case <-time.After(20 * time.Second):
		r.fail("%s: no answer in 20s", what)
		return false
	}
}

// finishAll lets every request in flight answer and waits for them.
func (r *hmRun) finishAll() {
	for len(r.flights) > 0 {
		r.finish(0)
	}
}

// finish lets the in-flight request i answer, waits for it and settles
// it in the model.
func (r *hmRun) finish(i int) {
	f := r.flights[i]
	r.flights = append(r.flights[:i], r.flights[i+1:]...)
	close(f.release)
	if !r.wait(f.done, "finishing "+f.q.String()) {
		return
	}
	r.logf("finished %s: %d", f.q, f.status)
	r.noteFeatures(f.q, f)
	r.m.settle(f)
}

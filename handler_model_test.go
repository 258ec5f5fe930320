package ratelimit

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestHandlerModel is the handler-level companion of the limiter's
// TestModel: a model-based test of what the docs promise a client, with
// everything between the request and the stores in the way. Several
// instances live in one process (hmInstances), each with two Handlers of
// its own (hmInstance): one for its memory zones, on the test's clock,
// and one for its redis zones, all instances' sharing one real
// redis-server, on real time plus the test's steps (Redis's TIME is real
// time). Memory zone names carry the instance's number, since memory
// zones of one name share their counters (docs/operations.md, "State
// and reloads"). Seeded random schedules drive them through ServeHTTP with
// requests of random cost, count_response and response_cost outcomes (in
// a header or a trailer), panics in next, leaky_bucket holds and clients
// that leave during them, requests that stay in flight across steps in
// concurrency zones, zones that pass requests over their limits on
// (`exceeded pass`: cw, lb and rw in some schedules), zones whose redis
// block has `global` (gf, gt: regions, in some schedules; hmRun.regions),
// override PUTs, DELETEs and expiries, tiers, admin resets (some while
// lease refills are in flight), busy keys of a leased redis zone
// (refilled ahead while they spend), reloads that keep or
// change a limit, clock steps, real time passing, and an instance whose
// Redis user may not call TIME, so that it decides by its own clock
// beside the others on Redis's. After every step an exact reference model
// (hmModel) checks every admission against the limit in force plus the
// bound the docs give it (docs/guarantees.md) (handler_model_checks_test.go lists
// them), and at quiet points, once every request has settled, that each
// store holds what the model says (hmRun.quiet, hmRun.finalRedis): no
// unit lost or counted twice.
//
// Replay one schedule with -handler-model.seed=N (or
// FLOODGATE_HANDLER_MODEL_SEED=N), as a failure prints; a whole run with
// -handler-model.base=N (1: a random base); run longer with
// -handler-model.schedules=N (and -timeout 0: a schedule takes about a
// tenth of a second). -handler-model.skip leaves out kinds of step
// (hmStepKinds), to isolate a failure. The log ends with one block of
// totals (run with -v to see it when the test passes).
//
// The instance on its own clock, instance 0 when a schedule mixes clocks,
// is skewed from Redis's TIME (this machine's clock) by 20 to 150 ms
// (less than 3/4 of the redis window), behind or ahead, drawn per
// schedule: its pooled ServerClock sends its scripts that clock
// (redisstore.ServerClock.SetInstanceClock), and the checks place its
// admissions, timed in real time like the others', by it (hmModel.offset)
// and hold each algorithm to what docs/redis.md says skew costs it
// ("Servers that refuse TIME in scripts"). Its edge step ("edge") tries a fixed
// window at the edge the skew moves.
func TestHandlerModel(t *testing.T) {
	if !redistest.Available() {
		t.Skip("no redis-server")
	}
	schedules, seed, replay := hmFlags.Settings(t)
	srv := redistest.Start(t)
	// An ACL user without TIME: its instance's scripts decide by the
	// instance's own clock (docs/redis.md, "Servers that refuse TIME
	// in scripts"), beside instances on Redis's TIME, on one server.
	srv.SetUser(t, hmNoTimeUser, []string{"on", ">" + hmNoTimePassword, "~*", "&*", "+@all", "-time"})
	// Regions: two regional servers and a global one, for the schedules
	// with regions (hmRun.regions).
	rs := &hmRegions{global: redistest.Start(t), region: [2]*redistest.Server{redistest.Start(t), redistest.Start(t)}}
	totals := &hmTotals{start: time.Now(), excess: map[string]*hmExcess{}, mixes: map[string]int{}, byZone: map[string]int{}, passedOn: map[string]int{}}
	failed := 0
	for i := range schedules {
		s := seed + uint64(i)
		if !replay {
			s = hmSeedFor(i, seed)
		}
		run := newHMRun(t, s, srv, rs, totals)
		if !run.run() {
			failed++
			if failed == 1 {
				t.Errorf("seed %d (replay: go test -race -count=1 -run '^TestHandlerModel$' . -handler-model.seed=%d%s): %s\nlast steps:\n%s",
					s, s, hmFlags.SkipArg(), run.failure, strings.Join(run.log[max(0, len(run.log)-hmLogTail):], "\n"))
			} else {
				t.Errorf("seed %d also fails: %s", s, run.failure)
			}
		}
	}
	t.Log(totals.report(failed))
}

// hmFlags are -handler-model.seed, .base, .schedules, .steps and .skip,
// with FLOODGATE_HANDLER_MODEL_SEED, _BASE and _SCHEDULES.
var hmFlags = testutil.NewModelFlags(testutil.ModelConfig{
	Test: "TestHandlerModel", Flag: "handler-model", Env: "FLOODGATE_HANDLER_MODEL", Log: "handler model",
	Schedules: hmDefaultSchedules, ShortSchedules: 4, Steps: hmDefaultSteps, Base: hmDefaultBase,
	Kinds: hmStepKinds,
})

// hmStepKinds are the kinds of step -handler-model.skip can leave out.
// Each of the known failure modes has a kind of its own, so that one can
// be isolated: "mixed" (an instance on its own clock), "race" (an admin
// reset while lease refills are in flight), "ovconc" (a concurrency
// key's override changed while its requests are in flight), "cost0"
// (requests of cost 0), "leave" (a client that leaves while held) and
// "gone" (a client gone before a remote zone's decision came back);
// "concexpiry" (a concurrency key's override lapsing while its requests
// are in flight) is ovconc's change of limit by expiry; "edge" (a fixed
// window tried by the instance behind just after it ended on the clock
// ahead) is mixed's; "pass" leaves every zone refusing (see
// hmRun.passes).
var hmStepKinds = []string{"cost0", "badcost", "charge", "trailer", "panic", "hold", "leave", "gone", "conc", "ovconc", "concexpiry", "override", "expiry", "tier", "reset", "race", "busy", "reload", "change", "step", "sleep", "mixed", "edge", "pass"}

// hmSkips reports whether -handler-model.skip leaves out kind.
func hmSkips(kind string) bool { return hmFlags.Skips(kind) }

const (
	hmInstances        = 3
	hmDefaultSchedules = 120
	hmDefaultSteps     = 80
	hmDefaultBase      = 20261127
	hmLogTail          = 40
	hmNoTimeUser       = "hmnotime"
	hmNoTimePassword   = "hm-no-time"
)

// hmSeedFor is schedule i's seed under base.
func hmSeedFor(i int, base uint64) uint64 {
	return (base*1099511628211+uint64(i)*0x9e3779b97f4a7c15)>>1 | 1
}

// hmTotals gathers the figures of a whole run.
type hmTotals struct {
	mu                                    sync.Mutex
	start                                 time.Time
	schedules, steps, admissions, refused int
	// passedOn counts, per zone, the requests it passed on over its
	// limit (`exceeded pass`).
	passedOn                map[string]int
	compared, comparedRedis int
	// excess is, per check (an algorithm and store), the largest excess
	// of admissions over the limit before the bound, and the bound.
	excess map[string]*hmExcess
	// mixes counts the schedules each mix of features appeared in.
	mixes map[string]int
	// byZone counts admissions per zone.
	byZone map[string]int
	// skewMin and skewMax are the least and greatest skew (either way)
	// of the schedules that mixed clocks.
	skewMin, skewMax time.Duration
	// reclaimsAsked and reclaimsHeard are the leased redis zones' lease
	// reclaims (lease_reclaims_total): the instances are handlers of one
	// process, which reach each other without Redis.
	reclaimsAsked, reclaimsHeard float64
}

type hmExcess struct {
	max   int64
	bound string
	seen  bool
}

// note records an excess (units over the limit, before the documented
// bound) seen by check, whose bound is described by bound.
func (tt *hmTotals) note(check string, excess int64, bound string) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	e := tt.excess[check]
	if e == nil {
		e = &hmExcess{bound: bound}
		tt.excess[check] = e
	}
	if !e.seen || excess > e.max {
		e.max, e.seen = excess, true
	}
}

// hmMixes are the mixes of features the totals count, each a schedule
// that had all of its features.
var hmMixes = []struct {
	name     string
	features []string
}{
	{"override change + concurrency in flight", []string{"ovconc"}},
	{"reset + refill", []string{"reset", "refill"}},
	{"mixed clocks", []string{"mixed"}},
	{"mixed clocks, instance 0 behind", []string{"mixed", "behind"}},
	{"mixed clocks, instance 0 ahead", []string{"mixed", "ahead"}},
	{"mixed clocks + edge step", []string{"mixed", "edge"}},
	{"hold + leave", []string{"hold", "leave"}},
	{"client gone before a remote decision", []string{"gone"}},
	{"client gone + reset + refill", []string{"gone", "reset", "refill"}},
	{"reset + lease refills in flight", []string{"race"}},
	{"reload while in flight", []string{"reload-inflight"}},
	{"response_cost charge + count_response", []string{"charge", "uncounted"}},
	{"trailer cost", []string{"trailer"}},
	{"panic in next", []string{"panic"}},
	{"override expiry", []string{"expiry"}},
	{"prefix override", []string{"prefix"}},
	{"prefix override + expiry", []string{"prefix", "expiry"}},
	{"tier", []string{"tier"}},
	{"cost 0", []string{"cost0"}},
	{"busy key (refilled ahead)", []string{"busy"}},
	{"exceeded pass", []string{"pass"}},
	{"regions", []string{"regions"}},
	{"regions + local_quota", []string{"regions", "regions-lease"}},
	{"regions + local_quota + busy key", []string{"regions", "busy-regions"}},
	{"regions + reload", []string{"regions", "regions-reload"}},
	{"regions + window's end mid-burst", []string{"regions", "regions-edge"}},
	{"regions + reset", []string{"regions", "regions-reset"}},
	{"regions + reset + refills in flight", []string{"regions", "regions-race"}},
	{"regions + override", []string{"regions", "regions-override"}},
}

func (tt *hmTotals) schedule(r *hmRun) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	tt.schedules++
	tt.steps += r.step
	tt.admissions += r.admitted
	tt.refused += r.refused
	for z, n := range r.passedOn {
		tt.passedOn[z] += n
	}
	tt.compared += r.compared
	tt.comparedRedis += r.comparedRedis
	for z, n := range r.byZone {
		tt.byZone[z] += n
	}
	if d := r.skew.Abs(); r.mixed {
		if tt.skewMin == 0 || d < tt.skewMin {
			tt.skewMin = d
		}
		tt.skewMax = max(tt.skewMax, d)
	}
	for _, m := range hmMixes {
		all := true
		for _, f := range m.features {
			all = all && r.features[f]
		}
		if all {
			tt.mixes[m.name]++
		}
	}
}

// report is the totals as one block, for BENCHMARKS.md.
func (tt *hmTotals) report(failed int) string {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "handler model totals (%v, %d instances):\n", time.Since(tt.start).Round(time.Millisecond), hmInstances)
	fmt.Fprintf(&b, "  schedules %d (%d failed), steps %d, admissions %d, refusals %d\n", tt.schedules, failed, tt.steps, tt.admissions, tt.refused)
	fmt.Fprintf(&b, "  states compared with the stores: %d at quiet points, %d in Redis at the ends\n", tt.compared, tt.comparedRedis)
	b.WriteString("  admissions per zone:")
	for _, z := range append(hmAllZones[:len(hmAllZones):len(hmAllZones)], hmGlobalZones...) {
		fmt.Fprintf(&b, " %s %d", z.id, tt.byZone[z.id])
	}
	b.WriteString("\n  passed on over the limit (exceeded pass), per zone:")
	for _, z := range []*hmZone{hmCW, hmLB, hmRW} {
		fmt.Fprintf(&b, " %s %d", z.id, tt.passedOn[z.id])
	}
	fmt.Fprintf(&b, "\n  lease reclaims: %.0f asked, %.0f heard", tt.reclaimsAsked, tt.reclaimsHeard)
	b.WriteString("\n  largest excess over the limit, per check, against its bound:\n")
	checks := make([]string, 0, len(tt.excess))
	for c := range tt.excess {
		checks = append(checks, c)
	}
	slices.Sort(checks)
	for _, c := range checks {
		e := tt.excess[c]
		fmt.Fprintf(&b, "    %-34s %+d units (bound: %s)\n", c, e.max, e.bound)
	}
	b.WriteString("  schedules per mix of features:\n")
	for _, m := range hmMixes {
		name := m.name
		if name == "mixed clocks" {
			name += fmt.Sprintf(" (skew %v–%v)", tt.skewMin, tt.skewMax)
		}
		fmt.Fprintf(&b, "    %-42s %d\n", name, tt.mixes[m.name])
	}
	return strings.TrimRight(b.String(), "\n")
}

package nearcache

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// TestModel is a model-based accuracy test of the promise in docs/near-cache.md
// ("What leases guarantee") and docs/design.md ("Exact at
// the edges"): instances together never admit more than the limit, and no
// unit is stranded. Seeded random schedules drive three instances (three
// NearCaches, or three stores for concurrency) over one shared store, a
// real redis-server or one Memory, on one injected clock that steps back
// at times (the store's: Redis's TIME can step; the caches read it through
// modelCacheClock, which never goes back, as the process's monotonic clock
// they read in production), and an exact reference model checks every
// admission after every step: see
// modelRun.checkKey and checkBucket for the limits, modelRun.reset for the
// allowance after an admin reset, and modelRun.quiet for the check that no
// unit is stranded. Refills ahead are sent and answered at steps of the
// schedule's own (model_ahead_test.go), and so are groups of lease
// requests sent in one call (model_group_test.go) and the requests of a
// refused instance for the others' leases (modelRun.reclaim).
//
// Replay one schedule with -model.seed=N (or FLOODGATE_MODEL_SEED=N) and a
// -run pattern naming its case, as a failure prints them; a whole run with
// -model.base=N (FLOODGATE_MODEL_BASE); run longer with -model.schedules=N
// (FLOODGATE_MODEL_SCHEDULES). -model.back bounds the clock's steps back
// (see modelBackFor) and -model.skip leaves out kinds of step, to isolate
// a failure. The log ends with a line per case, "model slack ...", and
// the totals.
func TestModel(t *testing.T) {
	schedules, seed, replay := modelFlags.Settings(t)
	var totals modelTotals
	t.Cleanup(func() {
		t.Logf("model totals: %d schedules, %d steps, %d admissions, %d failed schedules, %v",
			totals.schedules.Load(), totals.steps.Load(), totals.admissions.Load(), totals.failed.Load(), time.Since(totals.start).Round(time.Millisecond))
		t.Logf("model charges: %d (%d paid from a lease, %d overdrawn in the store, %d cut short by the cap); %d partial refunds",
			totals.charges.Load(), totals.paid.Load(), totals.overdrawn.Load(), totals.capped.Load(), totals.partial.Load())
		if !replay && !modelFlags.Skipping() && (totals.paid.Load() == 0 || totals.overdrawn.Load() == 0 || totals.capped.Load() == 0 || totals.partial.Load() == 0) {
			t.Error("the schedules should charge from leases, overdraw, reach the cap and refund in part")
		}
		t.Logf("model refills ahead: %d (%d admissions spent from them, %d requests waited for one); answered after the current lease expired %d, after a reset on another instance %d, to a closed cache %d; left unsent by a reset %d",
			totals.aheads.Load(), totals.aheadSpends.Load(), totals.waited.Load(), totals.aheadsLate.Load(), totals.aheadsReset.Load(), totals.aheadsClosed.Load(), totals.aheadsForgotten.Load())
		t.Logf("model reclaims: %d instances returned leases another asked for", totals.reclaimed.Load())
		t.Logf("model groups: %d group calls, %d of several asks; %d refills ahead and %d requests queued behind their lane's call; %d refills ahead answered in a group, %d of them after the current lease expired, after a reset elsewhere or to a closed cache",
			totals.groups.Load(), totals.groupsShared.Load(), totals.aheadsQueued.Load(), totals.queuedRequests.Load(), totals.aheadsGrouped.Load(), totals.aheadsGroupedLate.Load())
		if !replay && !modelFlags.Skipping() && !testing.Short() && (totals.groupsShared.Load() == 0 || totals.queuedRequests.Load() == 0 || totals.aheadsGroupedLate.Load() == 0) {
			t.Error("the schedules should send groups of several asks, queue requests behind a call under way, and answer a group's refill ahead after an expiry, a reset elsewhere or a close")
		}
		t.Logf("model leavers: %d queued requests left before their answer came; %d of them renewals; %d whose key was reset while queued and %d once decided; %d whose cache closed before it came",
			totals.left.Load(), totals.leftRenewals.Load(), totals.leftResetQueued.Load(), totals.leftReset.Load(), totals.leftClosed.Load())
		if !replay && !modelFlags.Skipping() && !testing.Short() && (totals.left.Load() == 0 || totals.leftRenewals.Load() == 0 || totals.leftResetQueued.Load() == 0 || totals.leftReset.Load() == 0 || totals.leftClosed.Load() == 0) {
			t.Error("the schedules should have queued requests leave before their answer came: one whose ask is a renewal, one whose key is reset while it is queued and once it is decided, and one whose cache is closed meanwhile")
		}
		if !replay && !modelFlags.Skipping() && !testing.Short() && (totals.reclaimed.Load() == 0 || totals.aheadSpends.Load() == 0 || totals.waited.Load() == 0 || totals.aheadsLate.Load() == 0 || totals.aheadsReset.Load() == 0 || totals.aheadsClosed.Load() == 0) {
			t.Error("the schedules should reclaim leases, spend leases refilled ahead, wait for one, and have one answer after the current lease expired, after a reset elsewhere and to a closed cache")
		}
	})
	totals.start = time.Now()
	backends := []struct {
		name  string
		setup func(t *testing.T) []redis.UniversalClient
	}{
		{"memory", func(*testing.T) []redis.UniversalClient { return nil }},
		{"redis", func(t *testing.T) []redis.UniversalClient {
			clients := instanceClients(t, []string{redistest.Start(t).Addr()}, modelInstances)
			t.Cleanup(func() { _ = storetest.CloseClients(clients) })
			return clients
		}},
	}
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			clients := be.setup(t)
			for _, c := range modelCases() {
				t.Run(c.name(), func(t *testing.T) {
					stats := &modelStats{}
					for i := range schedules {
						s := seed + uint64(i)
						if !replay {
							s = modelSeedFor(be.name, c, i, seed)
						}
						ok := runModelSchedule(t, c, clients, s, stats, &totals)
						totals.schedules.Add(1)
						if !ok {
							totals.failed.Add(1)
						}
					}
					t.Logf("model slack %s/%s: max excess %s (allowed %s); spans a step back covers: %s (allowed %s); %d schedules, %d failed",
						be.name, c.name(), stats.excessString(), c.allowedSlack(), stats.backString(), c.allowedBack(), schedules, stats.failed)
				})
			}
		})
	}
}

// modelFlags are -model.seed, .base, .schedules, .steps and .skip, with
// FLOODGATE_MODEL_SEED, _BASE and _SCHEDULES.
var modelFlags = testutil.NewModelFlags(testutil.ModelConfig{
	Test: "TestModel", Flag: "model", Env: "FLOODGATE_MODEL", Log: "model",
	Per: "case", Schedules: modelDefaultSchedules, ShortSchedules: 3, Steps: modelDefaultSteps, Base: modelDefaultBase,
	Kinds: modelStepKinds,
})

// modelTraceFlag logs every schedule's steps, not only a failing one's.
var modelTraceFlag = flag.Bool("model.trace", false, "TestModel: log the steps of every schedule")

// modelBackFlag bounds the clock's steps back (see modelBackFor).
var modelBackFlag = flag.Duration("model.back", -1, "TestModel: the largest step back of the clock (default: see modelBackFor)")

// modelStepKinds are the steps -model.skip can leave out.
var modelStepKinds = []string{"refund", "partial", "charge", "sweep", "back", "slow", "reset", "midreset", "limit", "quiet", "edge", "janitor", "ahead", "close", "reclaim", "burst", "leave"}

// modelSkips reports whether -model.skip leaves out kind.
func modelSkips(kind string) bool { return modelFlags.Skips(kind) }

const (
	modelInstances        = 3
	modelDefaultSchedules = 40
	modelDefaultSteps     = 100
	// modelDefaultBack is the largest step back of the shared clock the
	// schedules take by default (see modelBackFor).
	modelDefaultBack = 100 * time.Millisecond
)

// modelBackFor is the largest step back of the clock a schedule of alg
// takes: -model.back when given, else modelDefaultBack. Steps back come
// between decisions (the clock itself steps, as NTP may step it), and the
// reference allows each step back of δ exactly its documented effect on
// the store (modelRun.stepBack keeps them, modelStepBack says where each
// applies):
//   - concurrency: none;
//   - token_bucket: the bucket refills over those δ again: up to r × δ
//     more in any span that contains the step (modelRun.backDelta), on top
//     of the lease slack;
//   - sliding_window_log: entries logged after the step sit up to δ earlier
//     than those before it, so a span that contains the step holds at most
//     L in any W − δ of it; spans entirely before or after it keep W;
//   - fixed_window and sliding_window_counter: a time before the key's
//     stored window is decided in that window, no extra; but once the
//     store has forgotten the key (its count back to 0 by refunds, or
//     swept as idle) a step back across a window boundary counts the
//     window it went back into afresh: up to L more in that aligned window,
//     once per such step (modelKeyState.backs).
func modelBackFor(alg limiter.Algorithm) time.Duration {
	if *modelBackFlag >= 0 {
		return *modelBackFlag
	}
	return modelDefaultBack
}

// modelDefaultBase is the base seed of a plain run.
const modelDefaultBase = 20261123

// modelSeedFor is schedule i's seed: distinct per backend and case, so
// one base seed explores different schedules in each.
func modelSeedFor(backend string, c modelCase, i int, base uint64) uint64 {
	h := base
	for _, b := range []byte(backend + "/" + c.name()) {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return (h+uint64(i)*0x9e3779b97f4a7c15)>>1 | 1
}

type modelTotals struct {
	start                                time.Time
	schedules, steps, admissions, failed atomic.Int64
	// charges counts Charge steps; paid those a lease paid (in part or
	// whole), overdrawn those that took units from the store past its
	// limit, capped those the cap on debt cut short; partial counts
	// refunds of part of an admission.
	charges, paid, overdrawn, capped, partial atomic.Int64
	// aheads counts refills ahead; aheadSpends the admissions spent from
	// a lease refilled ahead; waited the requests that waited for one;
	// aheadsLate those that answered after the current lease expired,
	// aheadsReset those decided before a reset on another instance and
	// answered after it, aheadsClosed those that answered a closed cache,
	// aheadsForgotten those a reset on their own instance left unsent.
	aheads, aheadSpends, waited, aheadsLate, aheadsReset, aheadsClosed, aheadsForgotten atomic.Int64
	// reclaimed counts the instances that returned leases another asked
	// for.
	reclaimed atomic.Int64
	// groups counts group calls (lanes.go), groupsShared those of more
	// than one ask; aheadsQueued the refills ahead and queuedRequests the
	// requests that queued behind their lane's call; aheadsGrouped the
	// refills ahead answered in a group, aheadsGroupedLate those answered
	// after the current lease expired, after a reset elsewhere or to a
	// closed cache.
	groups, groupsShared, aheadsQueued, queuedRequests, aheadsGrouped, aheadsGroupedLate atomic.Int64
	// left counts the requests that left their lane's queue before their
	// answer came (burst); leftRenewals those whose ask was a renewal,
	// leftReset those whose key was reset on their instance once the
	// store decided and before the answer came, leftResetQueued those
	// whose key was reset while the ask was still queued, leftClosed
	// those whose cache closed meanwhile.
	left, leftRenewals, leftReset, leftResetQueued, leftClosed atomic.Int64
}

// modelCase is one algorithm with leases of fraction (0: none).
type modelCase struct {
	alg      limiter.Algorithm
	fraction float64
}

func (c modelCase) name() string {
	return fmt.Sprintf("%s/lease=%v", c.alg, c.fraction)
}

// allowedSlack describes the bound the checks allow beyond L (B for the
// bucket), for the totals line.
func (c modelCase) allowedSlack() string {
	if c.alg == limiter.TokenBucket && c.fraction > 0 {
		return "r×1s"
	}
	return "0"
}

// allowedBack describes what the checks allow a step back of δ, for the
// totals line (see modelBackFor).
func (c modelCase) allowedBack() string {
	switch c.alg {
	case limiter.TokenBucket:
		return "r×δ more"
	case limiter.SlidingWindowLog:
		return "L in W−δ"
	case limiter.FixedWindow, limiter.SlidingWindowCounter:
		return "L more in the window gone back into, with the key forgotten"
	}
	return "0"
}

func modelCases() []modelCase {
	var cases []modelCase
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow, limiter.SlidingWindowLog, limiter.SlidingWindowCounter} {
		for _, f := range []float64{0, 0.1, 0.5, 1} {
			cases = append(cases, modelCase{alg, f})
		}
	}
	return append(cases, modelCase{limiter.Concurrency, 0})
}

// modelStats gathers, over a case's schedules, the largest excess of
// admissions over the limit's own bound (L in a window or span; B + r(b−a)
// in a bucket's span; L in flight), before any slack or reset allowance.
//
// Where a step back's allowance applies (and no reset's), it gathers apart
// the largest excess, the allowance there, and the largest excess over the
// allowance (the bucket's includes the lease slack; for the sliding log,
// whose allowance is a shorter span, it is the units in the span of W
// outside its last W − δ).
type modelStats struct {
	mu     sync.Mutex
	excess float64
	seen   bool
	failed int
	// with a step back's allowance
	backExcess, backAllowed, backOver float64
	backSeen                          bool
}

func (s *modelStats) note(excess float64) {
	s.mu.Lock()
	if !s.seen || excess > s.excess {
		s.excess, s.seen = excess, true
	}
	s.mu.Unlock()
}

// noteBack notes the excess of a span a step back's allowance covers.
func (s *modelStats) noteBack(excess, allowed float64) {
	s.mu.Lock()
	if !s.backSeen || excess > s.backExcess {
		s.backExcess, s.backAllowed = excess, allowed
	}
	if !s.backSeen || excess-allowed > s.backOver {
		s.backOver = excess - allowed
	}
	s.backSeen = true
	s.mu.Unlock()
}

func (s *modelStats) excessString() string {
	if !s.seen {
		return "none observed"
	}
	return fmt.Sprintf("%+.3f units", s.excess)
}

func (s *modelStats) backString() string {
	if !s.backSeen {
		return "none observed"
	}
	return fmt.Sprintf("max excess %+.3f units (allowance there %.3f), max excess over the allowance %+.3f",
		s.backExcess, s.backAllowed, s.backOver)
}

// modelAdmission is one admitted request as the reference sees it.
type modelAdmission struct {
	id   int
	gen  int
	inst int
	key  string
	cost int64
	d    limiter.Admission
	// spend is when the admission counts (µs): for a decision of the
	// store, the store's own time of decision (Decision.At; the clock
	// when the store answered for the bucket scripts, which report none);
	// for a spend from a lease, the cache's clock, but never before the
	// lease's grant; and never before the key's time (modelKeyState.hwm).
	// A slow reply's latency is not the limiter's slack: a decision of the
	// store counts when it was made, not when the reply arrived.
	spend int64
	// store is when the store counted the units: the grant of the lease
	// they were spent from, or the decision itself.
	store int64
	// raw is the store's own clock when it counted the units (the
	// decision's, or the lease grant's), before the key's timeline (hwm)
	// moves it later: a sliding log entry is logged no earlier.
	raw    int64
	leased bool // spent from a lease in memory
	epoch  int  // resets of the key before it
	// A token bucket's refund keeps its admission, marked refunded, and
	// adds a credit of its units at the refund's time.
	refunded, credit bool
	// charged marks the units of a Charge, never refunded: paid from a
	// lease (counted by the store at the grant, within the limit like a
	// take's) or, overdrawn, taken from the store past the limit, which
	// the checks allow on top of it (see modelRun.charge).
	charged, overdrawn bool
	// stranded marks units the store counted for a refill whose
	// requester left and that no request will spend: decided after an
	// admin reset of the key on the instance while it was queued, the
	// cache drops the lease (refillAnswer.take), and they stay taken in
	// the fresh state, an under-admission, until it ends. Never refunded.
	stranded bool
}

// decidedByStore times a, an admission of the store that reported the
// time at (0 if none) and answered at decided, for a key last decided at
// prev. It counts at the store's own time of decision (see
// modelAdmission), not when the reply arrived: a reply's latency is not
// the limiter's slack. The bucket scripts report no time but for a lease;
// the clock when the store answered is theirs. Other than a window
// store's, it never counts before prev; a window store's decision time is
// already in the window it counted in (a time before its stored window is
// decided at that window's start), and a key it forgot counts afresh at
// the clock (see modelRun.stepBack).
func (a *modelAdmission) decidedByStore(at, decided, prev int64, alg limiter.Algorithm) {
	a.spend = at
	if a.spend == 0 {
		a.spend = decided
	}
	a.raw = a.spend
	if alg != limiter.FixedWindow && alg != limiter.SlidingWindowCounter {
		a.spend = max(a.spend, prev)
	}
	a.store = a.spend
}

// modelKeyState is what the reference keeps per policy generation and key.
type modelKeyState struct {
	epoch   int
	resetAt int64
	// hwm is the latest clock (µs) at which the store decided anything for
	// the key in this epoch. Each store keeps a key's time monotone when
	// the clock steps back (fixedWindowState.roll, the sliding log's entry
	// order), so an admission counts no earlier than hwm: the limit is
	// judged on the key's own timeline. A token bucket's refund credit
	// moves it too (see modelRun.refund).
	hwm int64
	// extra is how many units more than the bound the current epoch may
	// admit, and extraUntil the model time before which a span must start
	// for the allowance to apply (math.MaxInt64 while stale leases remain):
	// see modelRun.reset.
	extra      int64
	extraUntil int64
	stale      []modelStaleLease
	// backs are the window algorithms' step-back allowances in this
	// epoch: see modelRun.stepBack.
	backs []modelWindowBack
}

// modelWindowBack is a step back of the clock across a window boundary
// while the store held no state for a key (fixed_window and
// sliding_window_counter): the aligned window win it went back into is
// counted afresh, so it may hold up to units (L) more.
type modelWindowBack struct {
	win   int64 // aligned window index under the generation's W
	units int64
	step  int
}

// backAllowance is the step-back allowance of aligned window win and the
// steps it comes from.
func (ks *modelKeyState) backAllowance(win int64) (units int64, steps []int) {
	for _, b := range ks.backs {
		if b.win == win {
			units += b.units
			steps = append(steps, b.step)
		}
	}
	return units, steps
}

// modelStepBack is one step back of the shared clock, from from to to
// (µs), at step step, when model time was top. Admissions before it sit on
// the key's timeline at or before top, those after it at or after to, so
// a span of the timeline "contains the step" when it meets [to, top].
type modelStepBack struct {
	step             int
	from, to, top, d int64
}

// modelStaleLease is a lease another instance held when the key was reset,
// or a refill ahead of it whose store had decided, then its lease.
type modelStaleLease struct {
	inst  int
	gen   uint64
	ahead *modelAhead
}

// modelGen is one policy under one zone name: the instances' caches (or
// stores) and the reference's admissions under it. A limit change adds a
// generation with another policy that runs beside the old one.
type modelGen struct {
	p        limiter.Policy
	l, w, b  int64 // events, window (µs), burst
	quota    int64
	maxLease int64
	caches   []*Cache // nil for concurrency
	stores   []*modelSlowLeaser
	mem      *limiter.Memory // the memory backend's one store of this policy
	redis    []*redisstore.Store
	keys     map[string]*modelKeyState
	// grants maps an instance's lease of a key (its leaseGen) to the model
	// time its grant was decided.
	grants map[modelGrant]int64
	// rawGrants is the same grants' raw store clock (modelAdmission.raw).
	rawGrants map[modelGrant]int64
	// refunded is when a refund last went back into a lease: its units
	// are spent again no earlier, even if the clock stepped back since.
	refunded map[modelGrant]int64
	// aheadGens marks the leases that were refilled ahead.
	aheadGens map[modelGrant]bool
}

type modelGrant struct {
	inst int
	key  string
	gen  uint64
}

// modelSlowLeaser stands between a cache and the shared store. It notes the
// model time the store decided at, and when a step arms it, advances the
// shared clock by delay after the store has decided and before the cache
// hears the answer: a slow reply. When a take arms resetMid, an admin
// reset of the take's key runs on its instance at that moment too, while
// the answer (a lease, a refusal) is on its way; not during a renewal,
// whose give-back a reset waits for (see nearShard.backs).
type modelSlowLeaser struct {
	replyHook // calls answered
	m         *modelRun
	delay     time.Duration
	decided   int64
	resetMid  *modelMidReset
	// ahead is the refill ahead the model is sending (see TakeUpTo), group
	// the group (LeaseMany).
	ahead *modelAhead
	group *modelGroup
	// hold, when set, holds the next lone lease call (burst).
	hold *modelHold
	// returned lists the keys of the returns it took (ReturnMany).
	mu       sync.Mutex
	returned []string
}

// modelMidReset is the reset a take's answer waits for: on instance inst
// of generation gen, of key.
type modelMidReset struct {
	gen, inst int
	key       string
}

func (s *modelSlowLeaser) answered(renew bool) {
	s.decided = s.m.clock.Now().UnixMicro()
	s.m.observe()
	if r := s.resetMid; r != nil && !renew {
		s.resetMid = nil
		s.m.logf("gen %d inst %d: the store decided; its answer waits for a reset", r.gen, r.inst)
		s.m.reset(r.gen, r.inst, r.key)
	}
	if s.delay > 0 {
		s.m.clock.Advance(s.delay)
		s.delay = 0
	}
}

// Charge makes the slow leaser a Charger, as the store it stands for is.
func (s *modelSlowLeaser) Charge(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	ch, ok := s.Leaser.(limiter.Charger)
	if !ok {
		return limiter.Admission{}, fmt.Errorf("a %T cannot charge", s.Leaser)
	}
	d, err := ch.Charge(ctx, key, cost)
	s.answered(false)
	return d, err
}

// modelRun is one schedule.
type modelRun struct {
	t       *testing.T
	totals  *modelTotals
	ctx     context.Context
	c       modelCase
	seed    uint64
	rng     *rand.Rand
	clock   *testutil.Clock
	start   int64 // µs
	hwm     int64 // the latest the clock has shown, µs: model time
	clients []redis.UniversalClient
	prefix  string
	keys    []string
	gens    []*modelGen
	adm     []*modelAdmission // live: admitted and not refunded
	nextID  int
	step    int
	log     []string
	stats   *modelStats
	back    time.Duration
	// backs are the clock's steps back so far (see modelBackFor).
	backs []modelStepBack
	// lastRenew is the clock (µs) at the last renewal of concurrency slots.
	lastRenew int64
	// lastTake is the instance, key and generation of the last take.
	lastTake modelGrant
	// lastJanitor is the caches' clock (µs) at their last janitor pass.
	lastJanitor int64
	// ahead is how far (ns) the caches' clock is ahead of clock: the sum
	// of its steps back (see modelCacheClock).
	ahead   atomic.Int64
	failure string
	// aheads are the refills ahead under way (model_ahead_test.go);
	// waits and resume the hand-over of a request that waits for one,
	// queues of a lease request that joined its lane's queue; groups are
	// the group calls under way.
	aheads   []*modelAhead
	aheadSeq int
	groups   []*modelGroup
	groupSeq int
	queues   chan modelQueued
	// reclaims are the requests for leases not yet delivered.
	reclaims []modelReclaim
	waits    chan modelWait
	resume   chan struct{}
}

var modelPrefixSeq atomic.Int64

// modelCacheClock is the clock the caches read: the shared clock plus every
// step back it has taken, so it runs with the shared clock and never goes
// back. In production a Cache reads the process's monotonic clock and
// only the store's clock (Redis's TIME) can step back; a cache on the
// stepping clock would take a lease it granted before a step back for
// unexpired again (the shared clock back inside its window or lifetime)
// and take refunds into it and spend it after its window had ended on
// the key's timeline, which no process does. Times a cache reports (a
// lease's expiry) are on this clock: modelRun.cacheNow converts.
type modelCacheClock struct{ m *modelRun }

func (c modelCacheClock) Now() time.Time {
	return c.m.clock.Now().Add(time.Duration(c.m.ahead.Load()))
}

// cacheNow is the caches' clock (µs): see modelCacheClock.
func (m *modelRun) cacheNow() int64 {
	return modelCacheClock{m}.Now().UnixMicro()
}

// runModelSchedule runs one seeded schedule and reports whether it held.
func runModelSchedule(t *testing.T, c modelCase, clients []redis.UniversalClient, seed uint64, stats *modelStats, totals *modelTotals) bool {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	windows := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 30 * time.Second}
	p := limiter.Policy{Algorithm: c.alg, Events: 1 + rng.Int64N(8), Window: windows[rng.IntN(len(windows))]}
	if rng.IntN(3) == 0 {
		// A larger limit: leases grow over several requests, and a busy
		// key is refilled ahead (a streak of leases, then a lease low).
		p.Events = 9 + rng.Int64N(32)
	}
	if c.alg == limiter.TokenBucket && rng.IntN(2) == 0 {
		p.Burst = 1 + rng.Int64N(2*p.Events)
	}
	// Somewhere in a window, so boundaries fall anywhere in the schedule.
	start := time.Unix(1_800_000_000, 0).Add(time.Duration(rng.Int64N(int64(time.Hour))) / time.Microsecond * time.Microsecond)
	m := &modelRun{
		t: t, totals: totals, ctx: context.Background(), c: c, seed: seed, rng: rng,
		clock: testutil.NewClock(start), start: start.UnixMicro(), hwm: start.UnixMicro(),
		clients: clients, keys: []string{"alice", "bob", "carol"}, stats: stats, back: modelBackFor(c.alg),
		prefix: fmt.Sprintf("fgmodel-%d-%d:", modelPrefixSeq.Add(1), seed),
		waits:  make(chan modelWait), resume: make(chan struct{}), queues: make(chan modelQueued),
	}
	m.lastRenew, m.lastJanitor = m.hwm, m.hwm
	defer m.closeAll()
	if err := m.addGen(p); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	steps := modelFlags.Steps()
	for m.step = 1; m.step <= steps && m.failure == ""; m.step++ {
		m.doStep()
		if m.failure == "" {
			m.check()
		}
		totals.steps.Add(1)
	}
	if m.failure == "" {
		m.step = steps + 1
		m.quiet("end of schedule")
	}
	totals.admissions.Add(int64(m.nextID))
	if *modelTraceFlag {
		t.Log(strings.Join(m.log, "\n"))
	}
	if m.failure == "" {
		return true
	}
	stats.mu.Lock()
	stats.failed++
	first := stats.failed == 1
	stats.mu.Unlock()
	if first { // the first failure of a case in full; the rest by seed
		tail := m.log[max(0, len(m.log)-40):]
		t.Errorf("seed %d (replay: -run '%s' -model.seed=%d): %s\npolicy %s\nlast steps:\n%s",
			seed, m.caseRun(), seed, m.failure, p, strings.Join(tail, "\n"))
	} else {
		t.Errorf("seed %d also fails: %s", seed, m.failure)
	}
	return false
}

// caseRun is the -run pattern of this schedule's case.
func (m *modelRun) caseRun() string {
	be := "memory"
	if m.clients != nil {
		be = "redis"
	}
	return fmt.Sprintf("^TestModel$/^%s$/^%s$/^lease=%v$", be, m.c.alg, m.c.fraction)
}

// addGen starts a generation of policy p: new stores and caches under the
// same zone name and prefix as the first, so a limit change reuses them.
func (m *modelRun) addGen(p limiter.Policy) error {
	params, err := p.Compile()
	if err != nil {
		return err
	}
	q, _ := p.Quota()
	g := &modelGen{p: p, l: params.L, w: params.W, b: params.B, quota: q,
		keys: map[string]*modelKeyState{}, grants: map[modelGrant]int64{}, rawGrants: map[modelGrant]int64{}, refunded: map[modelGrant]int64{},
		aheadGens: map[modelGrant]bool{}}
	g.maxLease = int64(math.Ceil(m.c.fraction * float64(q)))
	for _, k := range m.keys {
		g.keys[k] = &modelKeyState{extraUntil: math.MinInt64}
	}
	var mem *limiter.Memory
	switch {
	case m.clients != nil:
	case p.Algorithm == limiter.Concurrency && len(m.gens) > 0:
		// The Caddy layer keeps one Memory per zone for concurrency,
		// whose limits are views of it: one set in flight per key.
		if mem, err = m.gens[0].mem.Sharing(p); err != nil {
			return err
		}
	default:
		// The Caddy layer keeps one Memory per policy.
		if mem, err = limiter.NewMemory(p, limiter.MemoryOptions{Clock: m.clock}); err != nil {
			return err
		}
	}
	g.mem = mem
	denyFor := time.Duration(0)
	if m.rng.IntN(2) == 0 {
		denyFor = time.Second
	}
	for i := range modelInstances {
		var inner limiter.Leaser = mem
		if m.clients != nil {
			r, err := redisstore.New(m.clients[i], p, redisstore.Options{Clock: m.clock, Zone: "model", Prefix: m.prefix, Timeout: 5 * time.Second})
			if err != nil {
				return err
			}
			g.redis = append(g.redis, r)
			inner = r
		}
		s := &modelSlowLeaser{m: m}
		s.replyHook = replyHook{Leaser: inner, answered: s.answered}
		g.stores = append(g.stores, s)
		if p.Algorithm == limiter.Concurrency {
			continue
		}
		opts := Options{LeaseFraction: m.c.fraction, DenyFor: denyFor, Clock: modelCacheClock{m}, manualSweep: true}
		m.aheadHooks(len(m.gens), i, &opts)
		cache, err := New(s, p, opts)
		if err != nil {
			return err
		}
		g.caches = append(g.caches, cache)
	}
	m.gens = append(m.gens, g)
	m.logf("gen %d: policy %s, deny cache %v", len(m.gens)-1, p, denyFor)
	return nil
}

func (m *modelRun) closeAll() {
	m.completeAheads(-1, -1, aheadQueued)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, g := range m.gens {
		for _, cache := range g.caches {
			_ = cache.Close(ctx)
		}
	}
}

// observe notes the clock and returns model time: the latest the clock
// has shown. Admissions count at their own times (modelAdmission.spend);
// model time places resets, quiet points and the ends of allowances.
func (m *modelRun) observe() int64 {
	m.hwm = max(m.hwm, m.clock.Now().UnixMicro())
	return m.hwm
}

func (m *modelRun) rel(us int64) string {
	return fmt.Sprintf("%+.6fs", float64(us-m.start)/1e6)
}

func (m *modelRun) logf(format string, args ...any) {
	now := m.clock.Now().UnixMicro()
	line := fmt.Sprintf("step %3d clock %s model %s: ", m.step, m.rel(now), m.rel(m.hwm)) + fmt.Sprintf(format, args...)
	m.log = append(m.log, line)
}

func (m *modelRun) fail(format string, args ...any) {
	if m.failure == "" {
		m.failure = fmt.Sprintf("step %d: ", m.step) + fmt.Sprintf(format, args...)
		m.logf("FAIL: %s", m.failure)
	}
}

// doStep picks and runs one step.
func (m *modelRun) doStep() {
	g := m.gens[m.rng.IntN(len(m.gens))]
	gi := slices.Index(m.gens, g)
	w := g.w
	switch r := m.rng.IntN(1000); {
	case r < 420:
		// Half the takes repeat the last one's instance and key, as a
		// busy key on one instance does: its leases grow and are spent.
		inst, key := m.rng.IntN(modelInstances), m.keys[m.rng.IntN(len(m.keys))]
		if m.lastTake.key != "" && m.lastTake.gen == uint64(gi) && m.rng.IntN(2) == 0 {
			inst, key = m.lastTake.inst, m.lastTake.key
		}
		m.lastTake = modelGrant{inst: inst, key: key, gen: uint64(gi)}
		if r < 30 && !modelSkips("burst") {
			m.burst(gi, inst)
			break
		}
		if r >= 390 && g.p.Algorithm.Traits().Charges && !modelSkips("charge") {
			m.charge(gi, inst, key)
			break
		}
		m.take(gi, inst, key, m.rng.IntN(5) == 0 && !modelSkips("slow"))
	case r < 530:
		if !modelSkips("refund") {
			m.refund()
		}
	case r < 600:
		if !modelSkips("sweep") {
			m.sweep(gi, m.rng.IntN(modelInstances))
		}
	case r < 760: // a small step: log-uniform in 1µs..W/3
		m.advance(time.Duration(math.Exp(m.rng.Float64()*math.Log(float64(w/3)))) * time.Microsecond)
	case r < 800:
		if !modelSkips("ahead") {
			m.stepAhead()
		}
	case r < 820: // a larger one: W/3..3W
		m.advance(time.Duration(w/3+m.rng.Int64N(3*w)) * time.Microsecond)
	case r < 900:
		if !modelSkips("edge") {
			m.edge(g)
		}
	case r < 940:
		if m.back > 0 && !modelSkips("back") {
			m.stepBack(time.Duration(1+m.rng.Int64N(m.back.Microseconds())) * time.Microsecond)
		}
	case r < 960:
		if !modelSkips("reset") {
			inst, key := m.rng.IntN(modelInstances), m.keys[m.rng.IntN(len(m.keys))]
			if a := m.decidedAhead(gi); a != nil && m.rng.IntN(2) == 0 {
				// Rather the key of a refill ahead whose store decided, on
				// another instance: its answer comes after the reset.
				inst, key = (a.inst+1+m.rng.IntN(modelInstances-1))%modelInstances, a.key
			}
			m.reset(gi, inst, key)
		}
	case r < 975:
		if len(m.gens) == 1 && !modelSkips("limit") {
			m.limitChange()
		}
	case r < 985:
		if !modelSkips("ahead") {
			m.stepAhead()
		}
	case r < 995:
		if !modelSkips("reclaim") {
			m.reclaim()
		}
	case r < 997:
		if !modelSkips("close") {
			m.closeInstance(gi, m.rng.IntN(modelInstances))
		}
	default:
		if !modelSkips("quiet") {
			m.quiet("quiet point")
		}
	}
	m.renewIfDue()
}

// edge moves the clock to just before or after an edge: the next window
// boundary of g, or the earliest expiry of a lease an instance holds
// (on the caches' clock, ahead of the shared one: see modelCacheClock).
func (m *modelRun) edge(g *modelGen) {
	now := m.clock.Now().UnixMicro()
	ahead := m.cacheNow() - now
	target := (now/g.w + 1) * g.w
	what := "window end"
	if m.rng.IntN(2) == 0 {
		for _, gen := range m.gens {
			for _, cache := range gen.caches {
				for i := range cache.shards {
					sh := &cache.shards[i]
					sh.mu.Lock()
					for _, k := range sh.keys {
						if exp := k.expires - ahead; k.units > 0 && exp > now && exp < target {
							target, what = exp, "lease expiry"
						}
						if exp := k.next.expires - ahead; k.next.units > 0 && exp > now && exp < target {
							target, what = exp, "expiry of a lease refilled ahead"
						}
					}
					sh.mu.Unlock()
				}
			}
		}
	}
	target += m.rng.Int64N(4001) - 2000 // within 2 ms either side
	if target > now {
		m.logf("to just about the %s", what)
		m.advance(time.Duration(target-now) * time.Microsecond)
	}
}

// stepBack steps the shared clock back by d between decisions and notes
// the step (modelRun.backs). For fixed_window and sliding_window_counter it
// also grants, per generation and key, the one allowance a step back may
// need: when it goes back across a boundary into a window before the
// key's stored window (the window of its latest decision, hwm) and nothing
// live counts for the key in that stored window (all its units refunded,
// or it had none), the store may have forgotten the key (Redis deletes a
// count back to 0, the memory store forgets an idle key), and then counts
// the window it went back into afresh: up to L more there. Its decisions
// then sit on the stepped-back timeline: the key's time becomes the
// clock's.
func (m *modelRun) stepBack(d time.Duration) {
	from := m.clock.Now().UnixMicro()
	top := m.observe()
	m.clock.Advance(-d)
	m.ahead.Add(int64(d)) // the caches' clock does not step (modelCacheClock)
	to := m.clock.Now().UnixMicro()
	m.backs = append(m.backs, modelStepBack{step: m.step, from: from, to: to, top: top, d: d.Microseconds()})
	m.logf("clock back %v (from %s)", d, m.rel(from))
	if m.c.alg != limiter.FixedWindow && m.c.alg != limiter.SlidingWindowCounter {
		return
	}
	for gi, g := range m.gens {
		for _, key := range m.keys {
			ks := g.keys[key]
			stored := ks.hwm / g.w
			if ks.hwm == 0 || to/g.w >= stored {
				continue // no window stored, or the step stays in or after it
			}
			held := false
			for _, a := range m.live(gi, key) {
				held = held || a.store/g.w == stored
			}
			if held {
				continue // the store holds the window: it decides in it
			}
			ks.backs = append(ks.backs, modelWindowBack{win: to / g.w, units: g.l, step: m.step})
			ks.hwm = to
			m.logf("gen %d %s: nothing live in its window [%s, %s): step-back allowance %d in [%s, %s)",
				gi, key, m.rel(stored*g.w), m.rel((stored+1)*g.w), g.l, m.rel(to/g.w*g.w), m.rel((to/g.w+1)*g.w))
		}
	}
}

// backDelta is the total (µs) of the steps back that a span [a, b] of the
// key's timeline contains (see modelStepBack), and those steps.
func (m *modelRun) backDelta(a, b int64) (d int64, steps []int) {
	for _, s := range m.backs {
		if s.to <= b && s.top >= a {
			d += s.d
			steps = append(steps, s.step)
		}
	}
	return d, steps
}

// advance moves the clock forward by d, doing on the way what an
// instance's goroutines would: the janitor's pass over every cache each
// quarter of a lease's lifetime (so a lease's units go back within
// LeaseLifetime and a quarter of its grant, as in production; the
// schedule's own sweep steps come on top), and the renewal of
// concurrency slots on Redis at least every W/3 while any are held. The
// janitor's ticks are timed on the caches' clock (a ticker of the process),
// which a step back of the shared clock does not delay.
func (m *modelRun) advance(d time.Duration) {
	m.logf("advance %v", d)
	janitor := (limiter.LeaseLifetime / 4).Microseconds()
	for d > 0 {
		now := m.clock.Now().UnixMicro()
		if m.cacheNow()-m.lastJanitor >= janitor {
			m.janitor()
		}
		// A refill ahead answers by its deadline (aheadTimeout).
		for at, a := m.nextDeadline(); a != nil && at <= m.cacheNow(); at, a = m.nextDeadline() {
			m.logf("gen %d inst %d: A%d answers at its deadline", a.gi, a.inst, a.id)
			m.deliverAhead(a)
		}
		step := min(d, time.Duration(m.lastJanitor+janitor-m.cacheNow())*time.Microsecond)
		if at, a := m.nextDeadline(); a != nil {
			step = min(step, time.Duration(at-m.cacheNow())*time.Microsecond)
		}
		if w := m.renewEvery(); w > 0 {
			next := time.Duration(m.lastRenew+w-now) * time.Microsecond
			if next <= 0 {
				m.renew()
				next = time.Duration(w) * time.Microsecond
			}
			step = min(step, next)
		}
		step = max(step, time.Microsecond)
		m.clock.Advance(step)
		d -= step
		m.observe()
	}
	if m.cacheNow()-m.lastJanitor >= janitor {
		m.janitor()
	}
	for at, a := m.nextDeadline(); a != nil && at <= m.cacheNow(); at, a = m.nextDeadline() {
		m.deliverAhead(a)
	}
}

// janitor runs every cache's janitor pass and waits for its give-backs.
func (m *modelRun) janitor() {
	m.lastJanitor = m.cacheNow()
	if modelSkips("janitor") {
		return
	}
	for gi, g := range m.gens {
		for i, cache := range g.caches {
			if cache.Len() == 0 {
				continue // nothing to give back or forget
			}
			held := cache.held()
			m.sweepCache(g, cache)
			if now := cache.held(); now != held {
				m.logf("gen %d inst %d janitor: held %d, now %d", gi, i, held, now)
			}
		}
	}
}

// renewEvery is how often (µs) concurrency slots are renewed: W/3 of the
// shortest window, or 0 when nothing renews.
func (m *modelRun) renewEvery() int64 {
	if m.c.alg != limiter.Concurrency || m.clients == nil {
		return 0
	}
	w := int64(math.MaxInt64)
	for _, g := range m.gens {
		w = min(w, g.w/3)
	}
	return w
}

func (m *modelRun) renewIfDue() {
	if w := m.renewEvery(); w > 0 && m.clock.Now().UnixMicro()-m.lastRenew >= w {
		m.renew()
	}
}

// renew renews every instance's slots, one call per store.
func (m *modelRun) renew() {
	m.lastRenew = m.clock.Now().UnixMicro()
	for _, g := range m.gens {
		for i, r := range g.redis {
			if err := r.RenewSlots(m.ctx); err != nil {
				m.fail("gen %d instance %d: renewing slots: %v", slices.Index(m.gens, g), i, err)
			}
		}
	}
}

// take asks instance inst of generation gi for cost units of key.
func (m *modelRun) take(gi, inst int, key string, slow bool) {
	g := m.gens[gi]
	cost := 1 + m.rng.Int64N(min(3, g.quota))
	st := g.stores[inst]
	if slow {
		st.delay = time.Duration(1+m.rng.Int64N(30)) * time.Millisecond
	}
	// An admin reset of the key on this instance while the store's answer
	// is on its way, if the take asks the store: the units the store
	// counted for it belong to the state the reset forgets (the epoch
	// before it), and the cache must neither spend what else the answer
	// granted nor repeat its refusal after the reset.
	midReset := g.caches != nil && m.rng.IntN(25) == 0 && !modelSkips("midreset")
	if midReset {
		st.resetMid = &modelMidReset{gen: gi, inst: inst, key: key}
	}
	epoch := g.keys[key].epoch
	st.decided = 0
	var d limiter.Admission
	var err error
	if g.caches == nil {
		d, err = st.Take(m.ctx, key, cost)
	} else {
		m.callWaiting(func() { d, err = g.caches[inst].Take(m.ctx, key, cost) })
		m.drainReturns(g) // a lease the next one replaced
	}
	st.delay, st.resetMid = 0, nil
	note := ""
	if slow {
		note = " (slow reply)"
	}
	m.book(gi, inst, key, cost, d, err, m.clock.Now().UnixMicro(), st.decided, epoch, midReset, note)
}

// book notes the answer to a take of cost units of key on instance inst
// of generation gi: d and err, which came at answered (the clock, µs),
// decided by the store at decided (0 if it did not decide), with epoch
// the key's resets when it was sent and midReset set when a reset of the
// key on this instance ran while the store's answer was on its way.
func (m *modelRun) book(gi, inst int, key string, cost int64, d limiter.Admission, err error, answered, decided int64, epoch int, midReset bool, slowNote string) {
	g := m.gens[gi]
	m.observe()
	if err != nil {
		m.fail("gen %d instance %d: take %s %d: %v", gi, inst, key, cost, err)
		return
	}
	if !d.Allowed {
		m.logf("gen %d inst %d take %s %d%s: denied by %v, remaining %d, retry %v", gi, inst, key, cost, slowNote, d.Source, d.Remaining, d.RetryAfter)
		if decided != 0 {
			// A refusal is a decision of the store on the key's timeline
			// too: the store moved the key's time on (a sliding log
			// dropped the entries that left its window then), so what it
			// admits after a step back of the clock counts no earlier.
			ks := g.keys[key]
			ks.hwm = max(ks.hwm, decided)
		}
		return
	}
	ks := g.keys[key]
	prev := ks.hwm
	if decided != 0 {
		ks.hwm = max(ks.hwm, decided)
	}
	a := &modelAdmission{id: m.nextID, gen: gi, inst: inst, key: key, cost: cost, d: d, epoch: ks.epoch}
	if midReset && d.Source == limiter.SourceStore && epoch != ks.epoch {
		// Decided before the reset that ran while its answer was on
		// its way: counted in the state the reset forgot.
		a.epoch = epoch
	}
	m.nextID++
	switch d.Source {
	case limiter.SourceStore:
		if decided == 0 {
			m.fail("gen %d instance %d: a decision of the store that never asked it", gi, inst)
			return
		}
		a.decidedByStore(d.Time, decided, prev, g.p.Algorithm)
		if d.Receipt.Lease != 0 {
			g.grants[modelGrant{inst, key, d.Receipt.Lease}] = a.store
			g.rawGrants[modelGrant{inst, key, d.Receipt.Lease}] = a.raw
		}
	case limiter.SourceLease:
		at, ok := g.grants[modelGrant{inst, key, d.Receipt.Lease}]
		if !ok {
			m.fail("gen %d instance %d: spent from lease %d of %s, which the model never saw granted", gi, inst, d.Receipt.Lease, key)
			return
		}
		lg := modelGrant{inst, key, d.Receipt.Lease}
		a.spend, a.store, a.raw, a.leased = max(answered, at, prev, g.refunded[lg]), at, g.rawGrants[lg], true
		if g.aheadGens[lg] {
			m.totals.aheadSpends.Add(1)
		}
		if g.p.Algorithm == limiter.FixedWindow || g.p.Algorithm == limiter.SlidingWindowCounter {
			// The store counted a window's lease in the window it was
			// granted in: after a step back the spend stays there, not at
			// a later time of the key's.
			a.spend = max(answered, at, g.refunded[lg])
		}
	default:
		m.fail("gen %d instance %d: an admission from %v", gi, inst, d.Source)
		return
	}
	if g.p.Algorithm == limiter.FixedWindow && a.spend/g.w != a.store/g.w {
		// docs/design.md: a fixed window's lease is never spent past the
		// end of the window it was taken in.
		m.fail("gen %d instance %d: #%d spent at %s from a lease of the window [%s, %s)",
			gi, inst, a.id, m.rel(a.spend), m.rel(a.store/g.w*g.w), m.rel((a.store/g.w+1)*g.w))
	}
	m.adm = append(m.adm, a)
	m.logf("gen %d inst %d take %s %d%s: #%d allowed by %v (granted %d, lease %d), remaining %d, at %s (store %s)",
		gi, inst, key, cost, slowNote, a.id, d.Source, d.Receipt.Granted, d.Receipt.Lease, d.Remaining, m.rel(a.spend), m.rel(a.store))
}

// charge charges key on instance inst of generation gi up to the whole
// quota, as the root does when a response costs more than was taken for
// it: the instance's lease pays what it can (units the store counted at
// the grant: spent like a take's), and the rest is taken from the store
// past the limit, an overdraft, which the checks allow on top of the
// limit where it was counted (its window, span or bucket). Charged units
// are never refunded.
func (m *modelRun) charge(gi, inst int, key string) {
	g := m.gens[gi]
	cost := 1 + m.rng.Int64N(g.quota)
	cache, st := g.caches[inst], g.stores[inst]
	before, gen, _ := cache.lease(key)
	st.decided = 0
	d, err := cache.Charge(m.ctx, key, cost)
	m.observe()
	if err != nil {
		m.fail("gen %d instance %d: charge %s %d: %v", gi, inst, key, cost, err)
		return
	}
	after, genAfter, _ := cache.lease(key)
	var paid int64
	if genAfter == gen { // a charge never takes a new lease
		paid = before - after
	}
	over := d.Granted() - paid
	// A charge is cut short only by the cap on debt, which leaves the key
	// owing.
	if paid < 0 || over < 0 || d.Granted() > cost || (d.Granted() < cost && d.Remaining > 0) {
		m.fail("gen %d instance %d: charge %s %d: %d charged, %d of them from the lease, remaining %d", gi, inst, key, cost, d.Granted(), paid, d.Remaining)
		return
	}
	m.totals.charges.Add(1)
	if paid > 0 {
		m.totals.paid.Add(1)
	}
	if over > 0 {
		m.totals.overdrawn.Add(1)
	}
	if d.Granted() < cost {
		m.totals.capped.Add(1)
	}
	ks := g.keys[key]
	prev := ks.hwm
	if st.decided != 0 {
		ks.hwm = max(ks.hwm, st.decided)
	}
	now := m.clock.Now().UnixMicro()
	var note []string
	if paid > 0 {
		lg := modelGrant{inst, key, gen}
		at, ok := g.grants[lg]
		if !ok {
			m.fail("gen %d instance %d: a charge paid from lease %d of %s, which the model never saw granted", gi, inst, gen, key)
			return
		}
		a := &modelAdmission{id: m.nextID, gen: gi, inst: inst, key: key, cost: paid, d: d, epoch: ks.epoch, leased: true, charged: true}
		m.nextID++
		// As a take spent from the lease (modelRun.take).
		a.spend, a.store, a.raw = max(now, at, prev, g.refunded[lg]), at, g.rawGrants[lg]
		if g.p.Algorithm == limiter.FixedWindow || g.p.Algorithm == limiter.SlidingWindowCounter {
			a.spend = max(now, at, g.refunded[lg])
		}
		if g.p.Algorithm == limiter.FixedWindow && a.spend/g.w != a.store/g.w {
			m.fail("gen %d instance %d: #%d charged at %s to a lease of the window [%s, %s)",
				gi, inst, a.id, m.rel(a.spend), m.rel(a.store/g.w*g.w), m.rel((a.store/g.w+1)*g.w))
		}
		m.adm = append(m.adm, a)
		note = append(note, fmt.Sprintf("#%d: %d from the lease at %s", a.id, paid, m.rel(a.spend)))
	}
	if over > 0 {
		if st.decided == 0 {
			m.fail("gen %d instance %d: %d units charged to the store, which was never asked", gi, inst, over)
			return
		}
		a := &modelAdmission{id: m.nextID, gen: gi, inst: inst, key: key, cost: over, d: d, epoch: ks.epoch, charged: true, overdrawn: true}
		m.nextID++
		// As a take the store decided (modelRun.take).
		a.decidedByStore(d.Time, st.decided, prev, g.p.Algorithm)
		m.adm = append(m.adm, a)
		note = append(note, fmt.Sprintf("#%d: %d from the store at %s", a.id, over, m.rel(a.spend)))
	}
	m.logf("gen %d inst %d charge %s %d: %d charged (%s), remaining %d", gi, inst, key, cost, d.Granted(), strings.Join(note, "; "), d.Remaining)
}

// refund gives back a random earlier admission, which may be long past:
// its lease may have been renewed, expired or given back since.
// modelBucketRefundDelay is the longest a schedule waits to refund a token
// bucket's admission: a refund comes within the request that took it (the
// request's later zones decide), and the bound docs/near-cache.md gives the bucket is
// r × this delay on top of the lease slack.
const modelBucketRefundDelay = 50 * time.Millisecond

func (m *modelRun) refund() {
	var open []int
	now := m.clock.Now().UnixMicro()
	for i, a := range m.adm {
		if a.refunded || a.credit || a.charged || a.stranded {
			continue
		}
		// A bucket's refund credits tokens when it is made, so one long
		// after its take would pass its cost again (the bucket cannot tell
		// its tokens had refilled). Refunds come within the request that
		// took the units; the model gives a bucket's that long at most.
		if m.gens[a.gen].p.Algorithm == limiter.TokenBucket && now-a.spend > modelBucketRefundDelay.Microseconds() {
			continue
		}
		open = append(open, i)
	}
	if len(open) == 0 {
		return
	}
	i := open[m.rng.IntN(len(open))]
	a := m.adm[i]
	g := m.gens[a.gen]
	if a.cost > 1 && g.p.Algorithm.Traits().Charges && m.rng.IntN(2) == 0 && !modelSkips("partial") {
		// Part of the admission back, as when a response cost less than
		// was taken for it: the rest stays live, and may come back later.
		// (A concurrency slot is released whole, and is never priced
		// after its response.)
		rest := *a
		rest.id = m.nextID
		m.nextID++
		a.cost = 1 + m.rng.Int64N(a.cost-1)
		rest.cost -= a.cost
		m.adm = append(m.adm, &rest)
		m.totals.partial.Add(1)
		m.logf("gen %d inst %d: #%d split for a partial refund: %d back, %d kept as #%d", a.gen, a.inst, a.id, a.cost, rest.cost, rest.id)
	}
	var d limiter.Decision
	var err error
	toStore := true
	prev := g.keys[a.key].hwm
	if g.caches == nil {
		d, err = g.stores[a.inst].GiveBack(m.ctx, a.key, a.cost, a.d.Receipt)
	} else {
		toStore = !g.caches[a.inst].refundsIntoLease(a.key, a.cost, a.d.Receipt)
		d, err = g.caches[a.inst].GiveBack(m.ctx, a.key, a.cost, a.d.Receipt)
	}
	if toStore {
		m.touch(g, a.key)
	}
	now = m.observe()
	if err != nil {
		m.fail("gen %d instance %d: refund of #%d: %v", a.gen, a.inst, a.id, err)
		return
	}
	m.adm = slices.Delete(m.adm, i, i+1)
	credit := max(m.clock.Now().UnixMicro(), a.spend, prev)
	if !toStore {
		lg := modelGrant{a.inst, a.key, a.d.Receipt.Lease}
		g.refunded[lg] = max(g.refunded[lg], credit)
	}
	if g.p.Algorithm == limiter.TokenBucket {
		// A bucket's refund puts tokens back when it is made, not when
		// the admission was: it stays counted where it was spent, and the
		// tokens count as a credit now (see checkBucket).
		m.adm = append(m.adm, a, &modelAdmission{id: -1 - a.id, gen: a.gen, inst: a.inst, key: a.key, cost: -a.cost,
			spend: credit, store: a.store, epoch: a.epoch, credit: true})
		a.refunded = true
		// The credit sits on the key's timeline at its time, so what
		// the store decides after it counts no earlier, even when the
		// clock has stepped back since. A refund into a lease reaches the
		// store only with the lease's give-back or renewal: a renewal
		// after a step back takes its units back at the stepped-back
		// clock, and, placed there, its take would sit before the credit
		// of units it returned in the same call (a span with the take
		// and not the credit counts those units twice).
		g.keys[a.key].hwm = max(g.keys[a.key].hwm, credit)
	}
	ks := g.keys[a.key]
	// A refund of units counted before the key's reset gives them to the
	// fresh state, which never counted them; so may one of units spent
	// from a lease granted before it.
	if a.epoch < ks.epoch {
		ks.extra += a.cost
	}
	// A.store at the reset's very instant may be a grant before it (the
	// clock did not move between them): taken as before, the lenient side.
	if a.epoch < ks.epoch || a.store <= ks.resetAt {
		ks.extraUntil = max(ks.extraUntil, now+1)
		if !toStore {
			// Refunded into a lease granted before the reset: its units
			// may pass until that lease is spent or given back.
			ks.stale = append(ks.stale, modelStaleLease{inst: a.inst, gen: a.d.Receipt.Lease})
			ks.extraUntil = math.MaxInt64
		}
	}
	m.logf("gen %d inst %d refund #%d (%s %d, %v at %s): remaining %d", a.gen, a.inst, a.id, a.key, a.cost, a.d.Source, m.rel(a.spend), d.Remaining)
}

// sweep runs one janitor pass of an instance's cache and waits for its
// give-backs, so they reach the store at this step's time.
func (m *modelRun) sweep(gi, inst int) {
	g := m.gens[gi]
	if g.caches == nil {
		return
	}
	before := g.caches[inst].held()
	m.sweepCache(g, g.caches[inst])
	m.logf("gen %d inst %d sweep: held %d, now %d", gi, inst, before, g.caches[inst].held())
}

// reset is an admin reset of key on one instance. Admissions before it no
// longer count. What other instances hold in leases then was taken from
// the state being forgotten, and Cache.Reset documents that they may
// still pass: spent after the reset (counted in the forgotten state), or
// given back into the fresh state, which never counted them. So the
// epoch may admit up to those units more, at most (instances − 1) ×
// ⌈f·Q⌉, in windows or spans that start before the last of those leases
// is spent or given back: in production the janitor gives them back
// within LeaseLifetime and a quarter; here a sweep step does, whenever it
// comes.
func (m *modelRun) reset(gi, inst int, key string) {
	g := m.gens[gi]
	ks := g.keys[key]
	var err error
	if g.caches == nil {
		_, err = g.stores[inst].Reset(m.ctx, key)
	} else {
		// A reset waits for the refills ahead sent on its instance, queued
		// in its lane or decided by the store (nearShard.backs): their
		// answers come first.
		m.completeAheads(gi, inst, aheadInLane)
		_, err = g.caches[inst].Reset(m.ctx, key)
	}
	now := m.observe()
	if err != nil {
		m.fail("gen %d instance %d: reset %s: %v", gi, inst, key, err)
		return
	}
	ks.epoch++
	ks.resetAt = now
	ks.hwm = 0 // the store forgot the key's time too
	if g.p.Algorithm == limiter.Concurrency {
		// Every generation's limit counts in the state just forgotten.
		for _, og := range m.gens {
			if og != g {
				og.keys[key].epoch++
				og.keys[key].resetAt = now
			}
		}
	}
	ks.extra, ks.extraUntil, ks.stale, ks.backs = 0, math.MinInt64, nil, nil
	for j, cache := range g.caches {
		if j == inst {
			continue
		}
		for _, l := range cache.leases(key) {
			if l.units > 0 {
				ks.extra += l.units
				ks.stale = append(ks.stale, modelStaleLease{inst: j, gen: l.gen})
			}
		}
	}
	// So do refills ahead that other instances' stores decided before the
	// reset, whose answers have not come: they are spent after it.
	for _, a := range m.aheads {
		if a.gi == gi && a.inst != inst && a.key == key && a.state == aheadDecided && a.d.Allowed {
			ks.extra += a.d.Receipt.Granted
			ks.stale = append(ks.stale, modelStaleLease{inst: a.inst, ahead: a})
		}
	}
	// A lease is at least the cost of the request that took it, and
	// units refunded into a lease return there, so a lease may hold up to
	// max(⌈f·Q⌉, the largest cost) units: more than the
	// ⌈f·Q⌉ of docs/near-cache.md when a request costs more than that. A
	// key's leases on an instance, the current one and the next
	// (refilled ahead, or being refilled) together, hold no more than
	// one lease may.
	if limit := int64(modelInstances-1) * max(g.maxLease, min(3, g.quota)); ks.extra > limit {
		m.fail("gen %d: other instances hold %d units of %s at its reset, more than (instances − 1) × max(⌈f·Q⌉, cost) = %d", gi, ks.extra, key, limit)
	}
	if len(ks.stale) > 0 {
		ks.extraUntil = math.MaxInt64
	}
	for k := range g.grants {
		if k.inst == inst && k.key == key {
			delete(g.grants, k) // the cache forgot the key: its lease numbers restart
			delete(g.rawGrants, k)
			delete(g.refunded, k)
		}
	}
	m.logf("gen %d inst %d reset %s: other instances hold %d units", gi, inst, key, ks.extra)
}

// touch notes that the store of g decides for key now: see
// modelKeyState.hwm.
func (m *modelRun) touch(g *modelGen, key string) {
	ks := g.keys[key]
	ks.hwm = max(ks.hwm, m.clock.Now().UnixMicro())
}

// sweepCache runs a janitor pass of cache, waits for its give-backs, and
// notes the keys whose state they touched.
func (m *modelRun) sweepCache(g *modelGen, cache *Cache) {
	cache.sweep(false)
	cache.givingBack.Wait()
	m.drainReturns(g)
}

// refundsIntoLease reports whether a refund of units of taken would go
// back into c's lease of key now rather than to the store (as GiveBack
// decides).
func (c *Cache) refundsIntoLease(key string, units int64, taken limiter.Receipt) bool {
	now := c.clock.now()
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return c.takesBack(sh.keys[key], taken, units, now)
}

// lease is the unspent units, the number and the expiry (µs) of the
// lease c holds for key.
func (c *Cache) lease(key string) (units int64, gen uint64, expires int64) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[key]; k != nil {
		return k.units, k.gen, k.expires
	}
	return 0, 0, 0
}

// limitChange starts a second policy under the same zone name, as a
// reload that changes the limit does while the old handler still serves
// requests on old connections.
func (m *modelRun) limitChange() {
	// A different limit, not merely a different spelling of one (a burst
	// of Events is the default burst): the same limit shares its state
	// by design.
	known := func(p limiter.Policy) bool {
		for _, g := range m.gens {
			if g.p.String() == p.String() {
				return true
			}
		}
		return false
	}
	p := m.gens[0].p
	windows := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 30 * time.Second, time.Hour}
	for known(p) {
		switch m.rng.IntN(3) {
		case 0:
			p.Events = 1 + m.rng.Int64N(8)
		case 1:
			p.Window = windows[m.rng.IntN(len(windows))]
		default:
			p.Events, p.Window = 1+m.rng.Int64N(8), windows[m.rng.IntN(len(windows))]
		}
		if p.Burst > 0 {
			p.Burst = 1 + m.rng.Int64N(2*p.Events)
		}
	}
	if err := m.addGen(p); err != nil {
		m.fail("limit change to %s: %v", p, err)
	}
}

// quiet lets every lease lapse and go back, then compares each store's
// state with what the reference still counts: a unit stranded in a store
// (a lost refund, a lease never given back) shows as too little remaining;
// a unit counted where it was not spent, as too much.
func (m *modelRun) quiet(why string) {
	m.logf("%s: refills ahead answer, leases lapse", why)
	m.completeAheads(-1, -1, aheadQueued)
	target := m.observe() + limiter.LeaseLifetime.Microseconds() + 1000
	m.advance(time.Duration(target-m.clock.Now().UnixMicro()) * time.Microsecond)
	m.renewIfDue()
	for gi, g := range m.gens {
		for _, cache := range g.caches {
			m.sweepCache(g, cache)
			if h := cache.held(); h != 0 {
				m.fail("gen %d: a cache still holds %d units after its leases lapsed and a sweep", gi, h)
				return
			}
		}
	}
	m.check() // the stale leases of a reset are gone now
	now := m.observe()
	for gi, g := range m.gens {
		for _, key := range m.keys {
			m.touch(g, key)
			d, err := g.stores[0].Leaser.Peek(m.ctx, key)
			if err != nil {
				m.fail("gen %d: peek %s: %v", gi, key, err)
				return
			}
			lo, hi, what := m.expectRemaining(g, gi, key, now)
			ks := g.keys[key]
			if ks.extra > 0 {
				hi += ks.extra
			}
			m.logf("gen %d %s: store remaining %d, reference %d..%d", gi, key, d.Remaining, lo, hi)
			if d.Remaining < lo {
				m.fail("gen %d %s at a quiet point: the store has %d remaining, the reference at least %d (%s): units stranded", gi, key, d.Remaining, lo, what)
				return
			}
			if d.Remaining > hi {
				m.fail("gen %d %s at a quiet point: the store has %d remaining, the reference at most %d (%s): units counted where they were not spent", gi, key, d.Remaining, hi, what)
				return
			}
		}
	}
}

// expectRemaining is the range of Remaining the reference allows the
// store to report for key at model time now, once every lease is back.
func (m *modelRun) expectRemaining(g *modelGen, gi int, key string, now int64) (lo, hi int64, what string) {
	live := m.live(gi, key)
	switch g.p.Algorithm {
	case limiter.FixedWindow:
		var n int64
		for _, a := range live {
			if a.spend/g.w == now/g.w {
				n += a.cost
			}
		}
		return max(0, g.l-n), max(0, g.l-n), fmt.Sprintf("%d units spent in this window", n)
	case limiter.SlidingWindowLog:
		// Certainly counted: units the store counted within the span.
		// Possibly counted: units spent within it, or of a lease that
		// lived into it: a grant of more than its request's cost is logged
		// a lifetime ahead, the request's own units with the lease's (see
		// slidingLogState.takeUpTo), so with leases on any admission's
		// units may stay a lifetime longer.
		var sure, maybe int64
		for _, a := range live {
			end := a.spend
			if g.maxLease > 0 {
				end = max(a.spend, a.store+limiter.LeaseLifetime.Microseconds())
			}
			if min(a.store, a.spend, a.raw) > now-g.w {
				sure += a.cost
			}
			if end > now-g.w {
				maybe += a.cost
			}
		}
		return max(0, g.l-maybe), max(0, g.l-sure), fmt.Sprintf("%d..%d units in the span", sure, maybe)
	case limiter.SlidingWindowCounter:
		var prev, cur int64
		for _, a := range live {
			switch a.store / g.w {
			case now / g.w:
				cur += a.cost
			case now/g.w - 1:
				prev += a.cost
			}
		}
		e := now % g.w
		r := max(0, (g.l*g.w-prev*(g.w-e)-cur*g.w)/g.w)
		return r, r, fmt.Sprintf("prev %d, cur %d by when the store counted them", prev, cur)
	case limiter.TokenBucket:
		// The tokens the store must have at least: the bucket, full at the
		// key's first take, less what was spent, refilled at r; refunds
		// and give-backs only add (see modelCheckBucket).
		b := g.b
		tokens := b * g.w
		for _, a := range live {
			if a.refunded || a.credit {
				continue
			}
			var spent int64
			for _, x := range live {
				if x.spend >= a.spend && !x.refunded && !x.credit {
					spent += x.cost
				}
			}
			tokens = min(tokens, b*g.w+g.l*(now-a.spend)-spent*g.w)
		}
		return max(0, tokens/g.w), b, fmt.Sprintf("at least %d tokens", max(0, tokens/g.w))
	case limiter.Concurrency:
		var n int64
		for _, a := range m.inFlight(key) {
			n += a.cost
		}
		return max(0, g.l-n), max(0, g.l-n), fmt.Sprintf("%d units in flight", n)
	}
	panic("unknown algorithm")
}

// inFlight is the reference's admissions of key under every generation
// still counted (as live), in the order they were decided: a concurrency
// zone's limits share one set of requests in flight.
func (m *modelRun) inFlight(key string) []*modelAdmission {
	var all []*modelAdmission
	for gi := range m.gens {
		all = append(all, m.live(gi, key)...)
	}
	slices.SortStableFunc(all, func(x, y *modelAdmission) int { return x.id - y.id })
	return all
}

// live is the reference's admissions of key under generation gi in the
// key's current epoch, by model time.
func (m *modelRun) live(gi int, key string) []*modelAdmission {
	ep := m.gens[gi].keys[key].epoch
	var live []*modelAdmission
	for _, a := range m.adm {
		if a.gen == gi && a.key == key && a.epoch == ep {
			live = append(live, a)
		}
	}
	slices.SortStableFunc(live, func(x, y *modelAdmission) int {
		return int(x.spend - y.spend)
	})
	return live
}

// check runs the reference's checks for every generation and key.
func (m *modelRun) check() {
	now := m.observe()
	for gi, g := range m.gens {
		for _, key := range m.keys {
			ks := g.keys[key]
			if len(ks.stale) > 0 {
				m.settleStale(g, ks, now)
			}
			m.checkKey(gi, g, key, ks)
			if m.failure != "" {
				return
			}
		}
	}
}

// settleStale ends a reset's allowance window once no other instance
// holds a lease it held at the reset.
func (m *modelRun) settleStale(g *modelGen, ks *modelKeyState, now int64) {
	key := ""
	for k, s := range g.keys {
		if s == ks {
			key = k
		}
	}
	held := ks.stale[:0]
	for _, s := range ks.stale {
		if s.ahead != nil {
			if s.ahead.state != aheadDone {
				held = append(held, s)
				continue
			}
			s.gen, s.ahead = s.ahead.gen, nil
		}
		for _, l := range g.caches[s.inst].leases(key) {
			if l.units > 0 && l.gen == s.gen && s.gen != 0 {
				held = append(held, s)
				break
			}
		}
	}
	ks.stale = held
	if len(held) == 0 {
		ks.extraUntil = now + 1
	}
}

// allowance is the reset allowance for a span starting at start.
func (ks *modelKeyState) allowance(start int64) int64 {
	if start < ks.extraUntil {
		return ks.extra
	}
	return 0
}

func (m *modelRun) checkKey(gi int, g *modelGen, key string, ks *modelKeyState) {
	live := m.live(gi, key)
	if len(live) == 0 {
		return
	}
	switch g.p.Algorithm {
	case limiter.FixedWindow, limiter.SlidingWindowCounter:
		// Units spent in any aligned window [kW, (k+1)W): at most L.
		for i := 0; i < len(live); {
			win := live[i].spend / g.w
			var n, over int64
			j := i
			for ; j < len(live) && live[j].spend/g.w == win; j++ {
				n += live[j].cost
				if live[j].overdrawn {
					over += live[j].cost
				}
			}
			back, steps := ks.backAllowance(win)
			switch {
			case ks.allowance(win*g.w) > 0:
			case back == 0:
				m.stats.note(float64(n - over - g.l))
			default:
				m.stats.noteBack(float64(n-over-g.l), float64(back))
			}
			if n > g.l+ks.allowance(win*g.w)+back+over {
				m.fail("gen %d %s: %d units spent in window [%s, %s), limit %d (overdrawn %d, reset allowance %d, step-back allowance %d of steps %v): admissions %s",
					gi, key, n, m.rel(win*g.w), m.rel((win+1)*g.w), g.l, over, ks.allowance(win*g.w), back, steps, ids(live[i:j]))
				return
			}
			i = j
		}
	case limiter.SlidingWindowLog:
		// Units spent in any span (t−W, t]: at most L; in one that
		// contains steps back of δ in all (modelRun.backDelta), at most L
		// in (t−(W−δ), t]. The count is largest at some admission's time.
		for j, a := range live {
			// Admissions at the same time as a are all in the span; the
			// last of them completes the count.
			if j+1 < len(live) && live[j+1].spend == a.spend {
				continue
			}
			delta, steps := m.backDelta(a.spend-g.w+1, a.spend)
			w := max(0, g.w-delta)
			var n, nw, over, overW int64
			first := j + 1
			for i := j; i >= 0 && live[i].spend > a.spend-g.w; i-- {
				nw += live[i].cost
				if live[i].overdrawn {
					overW += live[i].cost
				}
				if live[i].spend > a.spend-w {
					n += live[i].cost
					first = i
					if live[i].overdrawn {
						over += live[i].cost
					}
				}
			}
			reset := ks.allowance(a.spend - w)
			switch {
			case reset > 0:
			case delta == 0:
				m.stats.note(float64(n - over - g.l))
			default:
				m.stats.noteBack(float64(nw-overW-g.l), float64(nw-overW-n+over))
			}
			if n > g.l+reset+over {
				m.fail("gen %d %s: %d units spent in (%s, %s], limit %d in W − δ = %v after steps back of δ = %v (steps %v) (overdrawn %d, reset allowance %d): admissions %s",
					gi, key, n, m.rel(a.spend-w), m.rel(a.spend), g.l, time.Duration(w)*time.Microsecond,
					time.Duration(delta)*time.Microsecond, steps, over, reset, ids(live[first:j+1]))
				return
			}
		}
	case limiter.TokenBucket:
		m.checkBucket(gi, g, key, ks, live)
	case limiter.Concurrency:
		// Every limit of a zone counts the one set of requests in
		// flight: each admission, under its own generation's limit,
		// leaves no more in flight (of any generation) than that limit.
		all := m.inFlight(key)
		var n int64
		for j, a := range all {
			n += a.cost
			if a.gen != gi {
				continue
			}
			if ks.extra == 0 {
				m.stats.note(float64(n - g.l))
			}
			if n > g.l+ks.extra {
				m.fail("gen %d %s: %d units in flight once #%d was admitted, limit %d (reset allowance %d): admissions %s", gi, key, n, a.id, g.l, ks.extra, ids(all[:j+1]))
				return
			}
		}
	}
}

// checkBucket: units spent in any closed span [a, b], less the refunds
// made within it, are at most B + r(b−a) + slack, slack = r ×
// modelBucketRefundDelay (a refund credits what the bucket refilled since
// its take again), plus r × LeaseLifetime with leases (their units are
// taken from the bucket when granted and spent up to a lifetime later),
// plus r × δ for the steps back of
// δ in all that the span contains (modelRun.backDelta): the bucket refills
// over them again. In integers, multiplied through by W:
// n×W − L×(b−a) <= B×W + slack×W + L×δ. Every start a and end b at an
// admission's time is checked: the allowances depend on both.
func (m *modelRun) checkBucket(gi int, g *modelGen, key string, ks *modelKeyState, live []*modelAdmission) {
	// A refund up to modelBucketRefundDelay after its take credits what
	// the bucket refilled meanwhile again: r × that delay.
	slackW := g.l * modelBucketRefundDelay.Microseconds()
	if m.c.fraction > 0 {
		slackW += g.l * limiter.LeaseLifetime.Microseconds()
	}
	// prefix[k] is W × the units of live[:k], overs[k] W × those of them
	// overdrawn by charges.
	prefix, overs := make([]int64, len(live)+1), make([]int64, len(live)+1)
	for k, a := range live {
		prefix[k+1] = prefix[k] + a.cost*g.w
		overs[k+1] = overs[k]
		if a.overdrawn {
			overs[k+1] += a.cost * g.w
		}
	}
	for j, b := range live {
		if j+1 < len(live) && live[j+1].spend == b.spend {
			continue // the last admission at b's time completes the span
		}
		for i, a := range live[:j+1] {
			if i > 0 && live[i-1].spend == a.spend {
				continue // the first admission at a's time opens the span
			}
			lhs := prefix[j+1] - prefix[i] - g.l*(b.spend-a.spend) // n×W − L×(b−a)
			over := overs[j+1] - overs[i]
			extra := ks.allowance(a.spend)
			delta, steps := m.backDelta(a.spend, b.spend)
			switch {
			case extra > 0:
			case delta == 0:
				m.stats.note(float64(lhs-over-g.b*g.w) / float64(g.w))
			default:
				// The lease slack counts in the allowance here.
				m.stats.noteBack(float64(lhs-over-g.b*g.w)/float64(g.w), float64(g.l*delta+slackW)/float64(g.w))
			}
			if lhs > g.b*g.w+slackW+extra*g.w+g.l*delta+over {
				m.fail("gen %d %s: %.3f units spent in [%s, %s], bound B + r(b−a) = %.3f, slack %.3f (overdrawn %.3f, reset allowance %d, step-back allowance r×δ = %.3f for δ = %v of steps %v): admissions %s",
					gi, key, float64(prefix[j+1]-prefix[i])/float64(g.w), m.rel(a.spend), m.rel(b.spend),
					float64(g.b*g.w+g.l*(b.spend-a.spend))/float64(g.w), float64(slackW)/float64(g.w), float64(over)/float64(g.w), extra,
					float64(g.l*delta)/float64(g.w), time.Duration(delta)*time.Microsecond, steps, ids(live[i:j+1]))
				return
			}
		}
	}
}

// ids lists admissions for a failure message.
func ids(as []*modelAdmission) string {
	var b strings.Builder
	for i, a := range as {
		if i > 0 {
			b.WriteString(", ")
		}
		src := "store"
		if a.leased {
			src = "lease"
		}
		if a.charged {
			src += " (a charge)"
		}
		if a.stranded {
			src += " (stranded)"
		}
		fmt.Fprintf(&b, "#%d inst %d cost %d by %s", a.id, a.inst, a.cost, src)
	}
	return b.String()
}

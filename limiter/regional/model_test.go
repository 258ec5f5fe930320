package regional

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestModel is the model test of the regions' promise (docs/design.md,
// "Regions"): seeded random schedules drive regionModelRegions regions of
// regionModelInstances instances each (Stores over a MemoryPool per
// region) against one global limiter.Memory, all on one injected clock:
// takes and leases, give-backs into the pool and to global, the clock
// running on past batches' lifetimes and windows, every store's janitor
// sweeping on time (advance) and sweeps at random steps besides, refills
// abandoned by an instance that died holding the lock, global going down
// and coming back, instances closed and replaced. After every step it
// checks every admission so far against the limit: at most L per window
// for the window counters (a calendar day's included), at most L in any
// window-long span for the sliding log, at most B + r×T + r×(Lifetime +
// refund delay) in any span T for the token bucket. When nothing was
// stranded (no failure, no abandoned refill), it ends by letting every
// batch lapse and checking that global has every unspent unit back.
//
// Replay one schedule with -regions.seed=N and the -run pattern of its
// case, as a failure prints them; run longer with -regions.schedules=N.
func TestModel(t *testing.T) {
	schedules, seed, replay := regionFlags.Settings(t)
	for _, c := range regionModelCases(t) {
		t.Run(c.name, func(t *testing.T) {
			stats := &regionStats{}
			defer func() {
				t.Logf("%d admissions, %d refused, %d refills, %d units returned to global, %d give-backs into a pool, %d schedules checked for returns",
					stats.admissions, stats.refused, stats.refills, stats.returned, stats.intoPool, stats.quietChecks)
				if !replay && !regionFlags.Skipping() && (stats.refused == 0 || stats.returned == 0 || stats.intoPool == 0 || (c.p.Algorithm == limiter.FixedWindow && stats.quietChecks == 0)) {
					t.Error("the schedules should refuse, return units to global, give back into a pool and end with nothing stranded")
				}
			}()
			for i := range schedules {
				s := seed + uint64(i)
				if !replay {
					s = seed*1_000_003 + uint64(i)*0x9e3779b97f4a7c15 + uint64(len(c.name))
				}
				if !runRegionSchedule(t, c, s, stats) {
					return
				}
			}
		})
	}
}

var regionFlags = testutil.NewModelFlags(testutil.ModelConfig{
	Test: "TestModel", Flag: "regions", Env: "FLOODGATE_REGIONS", Log: "regions",
	Per: "case", Schedules: 40, ShortSchedules: 5, Steps: 160, Base: 20260801,
	Kinds: []string{"refund", "sweep", "janitor", "down", "abandon", "close"},
})

const (
	regionModelRegions   = 3
	regionModelInstances = 2
	regionModelL         = 20
	regionModelW         = 10 * time.Second
	// regionRefundDelay bounds how long after its take a token bucket's
	// admission is given back: a later refund credits the bucket with
	// what it refilled meanwhile (docs/design.md), slack the check allows.
	regionRefundDelay = 200 * time.Millisecond
)

type regionCase struct {
	name  string
	p     limiter.Policy
	quota float64
	start time.Time
}

func regionModelCases(t *testing.T) []regionCase {
	start := time.Date(2026, 3, 1, 23, 59, 45, 0, time.UTC) // days roll within a schedule
	var out []regionCase
	for _, q := range []float64{0.5, 0.2} {
		for _, p := range []limiter.Policy{
			{Algorithm: limiter.FixedWindow, Events: regionModelL, Window: regionModelW},
			{Algorithm: limiter.FixedWindow, Events: regionModelL, Calendar: &limiter.Calendar{Period: limiter.Day, Location: testutil.MustLoad(t, "Europe/Berlin")}},
			{Algorithm: limiter.SlidingWindowLog, Events: regionModelL, Window: regionModelW},
			{Algorithm: limiter.SlidingWindowCounter, Events: regionModelL, Window: regionModelW},
			{Algorithm: limiter.TokenBucket, Events: regionModelL, Window: regionModelW},
		} {
			st := start
			if p.Calendar != nil {
				st = time.Date(2026, 3, 1, 23, 59, 45, 0, p.Calendar.Location)
			}
			name := fmt.Sprintf("%s/quota=%v", p.Algorithm, q)
			if p.Calendar != nil {
				name = fmt.Sprintf("%s-calendar/quota=%v", p.Algorithm, q)
			}
			out = append(out, regionCase{name: name, p: p, quota: q, start: st})
		}
	}
	return out
}

// flakyGlobal is the global store, a Memory, that fails every call while
// down: an unreachable global Redis.
type flakyGlobal struct {
	*limiter.Memory
	down atomic.Bool
}

var errGlobalDown = errors.New("global is down")

func (g *flakyGlobal) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	if g.down.Load() {
		return limiter.Admission{}, errGlobalDown
	}
	return g.Memory.TakeUpTo(ctx, key, cost, want)
}

func (g *flakyGlobal) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	if g.down.Load() {
		return limiter.Admission{}, errGlobalDown
	}
	return g.Memory.Renew(ctx, back, cost, want)
}

func (g *flakyGlobal) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	if g.down.Load() {
		return errGlobalDown
	}
	return g.Memory.ReturnMany(ctx, returns)
}

func (g *flakyGlobal) GiveBack(ctx context.Context, key string, units int64, taken limiter.Receipt) (limiter.Decision, error) {
	if g.down.Load() {
		return limiter.Decision{}, errGlobalDown
	}
	return g.Memory.GiveBack(ctx, key, units, taken)
}

// regionAdmission is one admission the model keeps: units spent at spend
// (µs), less those given back.
type regionAdmission struct {
	id, region, inst int
	key              string
	spend, units     int64
	a                limiter.Admission
}

type regionRun struct {
	t     *testing.T
	c     regionCase
	seed  uint64
	rng   *rand.Rand
	clock *testutil.Clock
	// lastJanitor is when the janitors last swept (advance).
	lastJanitor int64
	global      *flakyGlobal
	pools       []*MemoryPool
	stores      [][]*Store
	adms        []*regionAdmission
	keys        []string
	// faults is set for the half of the schedules that take global down
	// and abandon refills.
	faults bool
	// stranded is set once units may be stranded (a failure, an abandoned
	// refill): the final check of returns is then skipped.
	stranded bool
	log      []string
	failure  string
	stats    *regionStats
}

// regionStats counts what a case's schedules did, so a run shows that
// they reached every path.
type regionStats struct {
	admissions, refused, refills, returned, intoPool, quietChecks int64
}

func runRegionSchedule(t *testing.T, c regionCase, seed uint64, stats *regionStats) bool {
	t.Helper()
	clock := testutil.NewClock(c.start)
	mem, err := limiter.NewMemory(c.p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	m := &regionRun{t: t, c: c, seed: seed, rng: rand.New(rand.NewPCG(seed, seed>>7|1)), clock: clock,
		global: &flakyGlobal{Memory: mem}, keys: []string{"a", "b"}, stats: stats}
	m.faults = m.rng.IntN(2) == 0
	m.lastJanitor = m.now()
	for r := range regionModelRegions {
		m.pools = append(m.pools, NewMemoryPool(clock))
		m.stores = append(m.stores, nil)
		for range regionModelInstances {
			m.stores[r] = append(m.stores[r], m.newStore(r))
		}
	}
	for range regionFlags.Steps() {
		m.step()
		if m.failure == "" {
			m.check()
		}
		if m.failure != "" {
			break
		}
	}
	if m.failure == "" {
		m.quiet()
	}
	if m.failure != "" {
		for _, l := range m.log {
			t.Log(l)
		}
		t.Errorf("seed %d: %s (replay: go test ./limiter/regional -run 'TestModel/%s' -regions.seed=%d)", seed, m.failure, c.name, seed)
		return false
	}
	return true
}

func (m *regionRun) newStore(region int) *Store {
	s, err := New(m.global, m.pools[region], m.c.p, Options{
		RegionQuota: m.c.quota, LockFor: 300 * time.Millisecond, Clock: m.clock,
		manualSweep: true, syncReturns: true, maxPolls: 1, poll: time.Microsecond,
		OnError:  func(error) { m.stranded = true },
		OnRefill: func(int64) { m.stats.refills++ },
		OnReturn: func(n int64) { m.stats.returned += n },
	})
	if err != nil {
		m.t.Fatal(err)
	}
	return s
}

func (m *regionRun) now() int64 { return m.clock.Now().UnixMicro() }

func (m *regionRun) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf("%+.3fs ", float64(m.now()-m.c.start.UnixMicro())/1e6)+fmt.Sprintf(format, args...))
}

func (m *regionRun) skips(kind string) bool { return regionFlags.Skips(kind) }

func (m *regionRun) step() {
	ctx := context.Background()
	r, i := m.rng.IntN(regionModelRegions), m.rng.IntN(regionModelInstances)
	key := m.keys[m.rng.IntN(len(m.keys))]
	s := m.stores[r][i]
	switch x := m.rng.IntN(100); {
	case x < 55:
		cost := 1 + m.rng.Int64N(3)
		want := cost
		if m.rng.IntN(3) == 0 {
			want += m.rng.Int64N(4)
		}
		a, err := s.TakeUpTo(ctx, key, cost, want)
		switch {
		case err != nil:
			m.logf("r%d/%d take %s %d..%d: %v", r, i, key, cost, want, err)
		case a.Allowed:
			adm := &regionAdmission{id: len(m.adms), region: r, inst: i, key: key, spend: m.now(), units: a.Granted(), a: a}
			m.adms = append(m.adms, adm)
			m.stats.admissions++
			m.logf("r%d/%d take %s %d..%d: #%d %d units (remaining %d)", r, i, key, cost, want, adm.id, adm.units, a.Remaining)
		default:
			m.stats.refused++
			m.logf("r%d/%d take %s %d: refused (retry %v)", r, i, key, cost, a.RetryAfter)
		}
	case x < 70:
		if m.skips("refund") {
			return
		}
		m.refund()
	case x < 90:
		d := time.Duration(m.rng.Int64N(int64(400 * time.Millisecond)))
		if m.rng.IntN(10) == 0 {
			d = time.Duration(m.rng.Int64N(int64(3 * time.Second)))
		}
		m.advance(d)
	case x < 95:
		if m.skips("sweep") {
			return
		}
		s.sweep(ctx, false)
		m.logf("r%d/%d sweep", r, i)
	case x < 97:
		if m.skips("down") || !m.faults {
			return
		}
		down := !m.global.down.Load()
		m.global.down.Store(down)
		m.stranded = m.stranded || down
		m.logf("global down: %v", down)
	case x < 98:
		if m.skips("abandon") || !m.faults {
			return
		}
		// An instance claims the refill and dies before it fills.
		sp, err := m.pools[r].Spend(ctx, key, PoolSpend{Cost: 1, Want: 1, Token: "dead", LockFor: s.lockFor, MaxBatch: s.maxBatch, Life: s.life})
		switch {
		case err != nil:
		case sp.Outcome == SpendRefill:
			m.stranded = true
			m.logf("r%d: refill of %s abandoned (%d lapsed units lost)", r, key, sp.Units)
		case sp.Outcome == SpendTaken:
			// The pool had the unit: the instance spent it and died
			// before it answered, a unit admitted and never given back.
			adm := &regionAdmission{id: len(m.adms), region: r, inst: i, key: key, spend: m.now(), units: sp.Units}
			m.adms = append(m.adms, adm)
			m.logf("r%d: an instance spent %d of %s and died: #%d", r, sp.Units, key, adm.id)
		}
	default:
		if m.skips("close") {
			return
		}
		if err := s.Close(ctx); err != nil {
			m.t.Fatal(err)
		}
		m.stores[r][i] = m.newStore(r)
		m.logf("r%d/%d closed and replaced", r, i)
	}
}

// advance moves the clock forward by d, doing on the way what each
// instance's janitor does: a sweep of every store each janitorEvery, so
// a lapsed batch's rest is back in global within janitorEvery of its
// lapse, as in production; the schedule's own sweep steps come on top.
// With -regions.skip=janitor only those steps and refills return lapsed
// batches, as when their installers died: Store.lateRest then keeps the
// token bucket's bound, which allows r × lateGrace more (a return that
// late still credits in full).
func (m *regionRun) advance(d time.Duration) {
	m.logf("advance %v", d)
	every := janitorEvery.Microseconds()
	for d > 0 {
		step := min(d, time.Duration(m.lastJanitor+every-m.now())*time.Microsecond)
		step = max(step, time.Microsecond)
		m.clock.Advance(step)
		d -= step
		if m.now()-m.lastJanitor >= every {
			m.janitor()
		}
	}
}

// janitor sweeps every store, as their janitors would.
func (m *regionRun) janitor() {
	m.lastJanitor = m.now()
	if m.skips("janitor") {
		return
	}
	for _, region := range m.stores {
		for _, s := range region {
			s.sweep(context.Background(), false)
		}
	}
}

// refund gives back all or part of a live admission.
func (m *regionRun) refund() {
	var held []*regionAdmission
	for _, a := range m.adms {
		if a.a.Held() == 0 {
			continue
		}
		if m.c.p.Algorithm == limiter.TokenBucket && m.now()-a.spend > regionRefundDelay.Microseconds() {
			continue
		}
		held = append(held, a)
	}
	if len(held) == 0 {
		return
	}
	a := held[m.rng.IntN(len(held))]
	n := 1 + m.rng.Int64N(a.a.Held())
	_, err := a.a.GiveBack(context.Background(), n)
	if err != nil {
		// Nothing was given back as far as the model can tell: keep
		// counting the units (the safe side).
		m.stranded = true
		m.logf("give back %d of #%d: %v", n, a.id, err)
		return
	}
	a.units -= n
	ps, _ := m.pools[a.region].Peek(context.Background(), a.key)
	into := ps.Batch.Mark == a.a.Receipt.Name() && ps.Now < ps.Batch.Expires && ps.Batch.TakesBack
	if into {
		m.stats.intoPool++
	}
	m.logf("give back %d of #%d (into the pool: %v)", n, a.id, into)
}

// check verifies every admission so far against the limit.
func (m *regionRun) check() {
	p := m.c.p
	l, w := p.Events, p.Window.Microseconds()
	for _, key := range m.keys {
		var live []*regionAdmission
		for _, a := range m.adms {
			if a.key == key && a.units > 0 {
				live = append(live, a)
			}
		}
		switch p.Algorithm {
		case limiter.FixedWindow, limiter.SlidingWindowCounter:
			sums := map[int64]int64{}
			for _, a := range live {
				win := a.spend / max(w, 1)
				if p.Calendar != nil {
					start, _ := p.Calendar.Window(time.UnixMicro(a.spend))
					win = start.UnixMicro()
				}
				sums[win] += a.units
				if sums[win] > l {
					m.failure = fmt.Sprintf("%s: %d units spent in window %d, limit %d (admission #%d)", key, sums[win], win, l, a.id)
					return
				}
			}
		case limiter.SlidingWindowLog:
			for j, b := range live {
				var n int64
				for i := j; i >= 0 && live[i].spend > b.spend-w; i-- {
					n += live[i].units
				}
				if n > l {
					m.failure = fmt.Sprintf("%s: %d units spent in the span of W ending at #%d, limit %d", key, n, b.id, l)
					return
				}
			}
		case limiter.TokenBucket:
			slack := (Lifetime + regionRefundDelay).Microseconds()
			if m.skips("janitor") {
				slack += lateGrace.Microseconds()
			}
			for j, b := range live {
				var n int64
				for i := j; i >= 0; i-- {
					n += live[i].units
					// n×W − L×(b−a) ≤ B×W + L×slack
					if n*w-l*(b.spend-live[i].spend) > l*w+l*slack {
						m.failure = fmt.Sprintf("%s: %d units spent from #%d to #%d, over %v: above B + r×T + r×%v",
							key, n, live[i].id, b.id, time.Duration(b.spend-live[i].spend)*time.Microsecond, time.Duration(slack)*time.Microsecond)
						return
					}
				}
			}
		}
	}
}

// quiet lets every batch lapse, sweeps every instance and checks that
// global has every unit no admission still holds: for the fixed window,
// L less the units spent in the current window.
func (m *regionRun) quiet() {
	ctx := context.Background()
	m.global.down.Store(false)
	m.clock.Advance(Lifetime + time.Millisecond)
	for _, region := range m.stores {
		for _, s := range region {
			s.sweep(ctx, false)
		}
	}
	for r, pool := range m.pools {
		for _, key := range m.keys {
			ps, _ := pool.Peek(ctx, key)
			if ps.Now < ps.Batch.Expires && ps.Batch.Units > 0 {
				m.failure = fmt.Sprintf("region %d still holds %d units of %s after a lifetime", r, ps.Batch.Units, key)
				return
			}
		}
	}
	if m.stranded || m.c.p.Algorithm != limiter.FixedWindow {
		return
	}
	m.stats.quietChecks++
	now := m.now()
	for _, key := range m.keys {
		var spent int64
		for _, a := range m.adms {
			if a.key != key {
				continue
			}
			var same bool
			if m.c.p.Calendar == nil {
				same = a.spend/m.c.p.Window.Microseconds() == now/m.c.p.Window.Microseconds()
			} else {
				s1, _ := m.c.p.Calendar.Window(time.UnixMicro(a.spend))
				s2, _ := m.c.p.Calendar.Window(time.UnixMicro(now))
				same = s1.Equal(s2)
			}
			if same {
				spent += a.units
			}
		}
		d, err := m.global.Peek(ctx, key)
		if err != nil {
			m.t.Fatal(err)
		}
		if want := m.c.p.Events - spent; d.Remaining != want {
			m.failure = fmt.Sprintf("%s: global has %d left once every batch lapsed and was returned, want %d (L less %d spent this window)", key, d.Remaining, want, spent)
			return
		}
	}
}

// Package regional gives regions one exact limit per key: a Store decides
// against its region's pool (the regional Redis) and takes units from the
// global store, a limiter.Leaser, only when the pool runs short, one refill
// at a time per key and region. The region is to global what an instance
// with a near cache is to its Redis: a large lessee. Every unit it admits
// was counted by global first, so all regions together never admit more
// than the limit; what a region holds unspent goes back to global when its
// lifetime ends. See docs/design.md ("Regions").
package regional

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Lifetime is how long a region spends a batch from global: the lease
// lifetime, since global logs a sliding log's lease a lease lifetime ahead
// of its grant (limiter.LeaseLifetime), so a unit spent within it stays
// in global's window until W after its spend.
const Lifetime = limiter.LeaseLifetime

// DefaultLockFor is how long a refill holds its key's lock when
// Options.LockFor is zero: an instance that dies mid-refill holds up its
// region's refills of that key no longer.
const DefaultLockFor = 500 * time.Millisecond

// denyFor caps how long a region repeats global's refusal: units other
// regions return come back to global within a quarter lifetime of their
// lapse (the janitors' tick), and a region asks again no later.
const denyFor = Lifetime / 4

// pollEvery is how often an instance waiting for its region's refill
// looks at the pool again.
const pollEvery = 2 * time.Millisecond

// Options configures a Store.
type Options struct {
	// RegionQuota is the largest share of the quota a region holds at
	// once, in (0, 1]: a batch holds at most ⌈RegionQuota × Q⌉ units
	// (Q: Burst for the token bucket, else Events), or a request's cost
	// when larger.
	RegionQuota float64
	// LockFor bounds a refill's hold on its key's lock; zero means
	// DefaultLockFor. It should exceed the global store's timeout.
	LockFor time.Duration
	// Clock is the instance's clock, which times the janitor; nil is the
	// system clock. The pool and global keep their own.
	Clock limiter.Clock
	// OnRefill hears of every batch global granted (its units); OnReturn
	// of units returned to global; OnError of units a return may not have
	// brought back (they stay counted in global until its state lapses).
	OnRefill func(units int64)
	OnReturn func(units int64)
	OnError  func(error)

	// manualSweep keeps the janitor from starting (tests call sweep).
	manualSweep bool
	// maxPolls bounds the looks at a pool whose refill another instance
	// holds; zero means LockFor / pollEvery + 1.
	maxPolls int
	// poll is the wait between looks; zero means pollEvery.
	poll time.Duration
	// syncReturns returns units to global before the call that freed
	// them answers, so a test's schedule stays deterministic.
	syncReturns bool
}

// Store decides a region's requests from its pool, taking from global
// when the pool runs short. It implements limiter.Leaser, so a
// nearcache.Cache can sit in front of it as in front of the Redis store,
// and limiter.Charger when global does.
type Store struct {
	global  limiter.Leaser
	charger limiter.Charger
	pool    Pool
	policy  limiter.Policy
	alg     limiter.Algorithm
	quota   int64
	// maxBatch is ⌈RegionQuota × Q⌉.
	maxBatch int64
	// window (µs) or cal, for the window counters: a batch never outlives
	// the window global granted it in.
	window int64
	cal    *limiter.CalendarWindows
	// rateL per rateW µs is the token bucket's refill (see lateRest).
	rateL, rateW int64
	life         int64 // µs
	lockFor      int64 // µs
	token        string
	seq          atomic.Uint64
	clock        limiter.Clock
	poll         time.Duration
	polls        int
	// syncReturns: see Options.syncReturns.
	syncReturns bool

	onRefill, onReturn func(int64)
	onError            func(error)

	// mu guards filled: the batches this instance installed, which its
	// janitor drains back to global when they lapse.
	mu     sync.Mutex
	filled map[string]filledBatch

	stop     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
	// returning counts returns to global under way, which Close waits for.
	returning sync.WaitGroup
}

// filledBatch is a batch this instance installed: its mark, global's
// state that granted it and when it lapses, on the instance's clock (µs).
type filledBatch struct {
	mark, lapses int64
	epoch        uint64
}

// Algorithms is the algorithms a region can share exactly: those whose
// units can be handed out ahead (limiter.Traits.Leases). A leaky bucket's
// units are waits and a concurrency slot is a request in flight.
func Algorithms() []limiter.Algorithm {
	var out []limiter.Algorithm
	for _, a := range limiter.Algorithms {
		if a.Traits().Leases {
			out = append(out, a)
		}
	}
	return out
}

// New returns a region's store over global (the global store, enforcing
// p) and pool (the region's). Close it to return its batches.
func New(global limiter.Leaser, pool Pool, p limiter.Policy, opts Options) (*Store, error) {
	if global == nil || pool == nil {
		return nil, errors.New("regional store: a global store and a regional pool are both needed")
	}
	if !p.Algorithm.Traits().Leases {
		return nil, fmt.Errorf("regional store: %s cannot be shared by regions exactly (only %v can)", p.Algorithm, Algorithms())
	}
	params, err := p.Compile()
	if err != nil {
		return nil, fmt.Errorf("regional store: %w", err)
	}
	f := opts.RegionQuota
	if !(f > 0 && f <= 1) {
		return nil, fmt.Errorf("regional store: region quota %v outside (0, 1]", f)
	}
	if opts.LockFor < 0 {
		return nil, fmt.Errorf("regional store: negative lock time %v", opts.LockFor)
	}
	q, _ := p.Quota()
	s := &Store{
		global:   global,
		pool:     pool,
		policy:   p,
		alg:      p.Algorithm,
		quota:    q,
		maxBatch: max(1, int64(math.Ceil(f*float64(q)))),
		life:     Lifetime.Microseconds(),
		rateL:    params.L,
		rateW:    max(1, params.W),
		lockFor:  opts.LockFor.Microseconds(),
		clock:    opts.Clock,
		poll:     opts.poll,
		polls:    opts.maxPolls,

		syncReturns: opts.syncReturns,
		onRefill:    opts.OnRefill,
		onReturn:    opts.OnReturn,
		onError:     opts.OnError,
		filled:      make(map[string]filledBatch),
		stop:        make(chan struct{}),
		stopped:     make(chan struct{}),
	}
	if s.lockFor == 0 {
		s.lockFor = DefaultLockFor.Microseconds()
	}
	if s.clock == nil {
		s.clock = limiter.SystemClock
	}
	if s.poll == 0 {
		s.poll = pollEvery
	}
	if s.polls == 0 {
		s.polls = int(s.lockFor/s.poll.Microseconds()) + 1
	}
	if p.Algorithm.Traits().Charges {
		s.charger, _ = global.(limiter.Charger)
	}
	switch p.Algorithm {
	case limiter.FixedWindow, limiter.SlidingWindowCounter:
		if params.Windows != nil {
			s.cal = params.Windows
		} else {
			s.window = params.W
		}
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails: crypto/rand aborts the program instead
	s.token = hex.EncodeToString(id[:]) + "."
	if opts.manualSweep {
		close(s.stopped)
	} else {
		go s.janitor()
	}
	return s, nil
}

// Policy is the limit the store enforces.
func (s *Store) Policy() limiter.Policy { return s.policy }

// Take implements limiter.Store.
func (s *Store) Take(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	return s.take(ctx, key, cost, cost)
}

// TakeUpTo implements limiter.Leaser: a near cache's lease from the
// region's units. A sliding log's lease is the cost alone: global logged
// the batch's units a lifetime ahead of its grant, and a lease spent up to
// a lifetime after the region's last spend would leave the window early.
func (s *Store) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	if cost < 1 || want < cost {
		return limiter.Admission{}, fmt.Errorf("regional store: lease of %d for a cost of %d", want, cost)
	}
	if s.alg == limiter.SlidingWindowLog {
		want = cost
	}
	return s.take(ctx, key, cost, want)
}

// take spends up to want units (at least cost) of key from the pool,
// refilling it from global when it is short.
func (s *Store) take(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	if cost < 1 || cost > s.policy.MaxCost() {
		return limiter.Admission{}, fmt.Errorf("regional store: cost %d outside 1..%d", cost, s.policy.MaxCost())
	}
	req := PoolSpend{Cost: cost, Want: want, LockFor: s.lockFor, MaxBatch: max(s.maxBatch, cost), Life: s.life}
	for polls := 0; ; polls++ {
		req.Token = s.token + strconv.FormatUint(s.seq.Add(1), 36)
		sp, err := s.pool.Spend(ctx, key, req)
		if err != nil {
			return limiter.Admission{}, fmt.Errorf("regional store: the region's pool: %w", err)
		}
		switch sp.Outcome {
		case SpendTaken:
			return s.spent(key, sp, sp.Units), nil
		case SpendDenied:
			return limiter.Admission{Decision: denied(sp)}, nil
		case SpendRefill:
			return s.refill(ctx, key, cost, want, req.Token, sp)
		}
		// Another instance of the region is asking global: wait for its
		// batch, a little at a time.
		if polls >= s.polls {
			return limiter.Admission{}, errors.New("regional store: the region's refill of the key took too long")
		}
		t := time.NewTimer(min(s.poll, time.Duration(sp.Wait)*time.Microsecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return limiter.Admission{}, fmt.Errorf("regional store: waiting for the region's refill: %w", ctx.Err())
		}
	}
}

// spent is the admission of units spent from the batch sp reports.
func (s *Store) spent(key string, sp Spent, units int64) limiter.Admission {
	b := sp.Batch
	elapsed := sp.Now - b.Sent
	d := limiter.Decision{
		Allowed:    true,
		Remaining:  min(s.quota, b.Remaining+b.Units),
		ResetAfter: max(0, time.Duration(b.Reset-elapsed)*time.Microsecond),
	}
	if b.Time != 0 {
		// Global's clock now, counted from before it decided: no earlier
		// than the truth, and (the batch lapses at its window's end)
		// still in the grant's window, so a near cache in front ends its
		// lease no later than that window.
		d.Time = b.Time + elapsed
	}
	return limiter.NewAdmission(s, key, units, d, s.receipt(d.Time, b, units))
}

// receipt names units of batch b: Mark is the grant's name, which a
// give-back takes back into its batch or to global, and Epoch global's
// state that granted it, the only one a give-back to global reaches. A
// sliding log's receipt has At = Mark, so a near cache in front takes no
// refund back into its lease (see TakeUpTo).
func (s *Store) receipt(at int64, b Batch, units int64) limiter.Receipt {
	if s.alg == limiter.SlidingWindowLog || at == 0 {
		at = b.Mark
	}
	return limiter.Receipt{At: at, Mark: b.Mark, Epoch: b.Epoch, Granted: units}
}

// globalReceipt names, for a give-back to global, units of its grant mark
// by its state epoch.
func globalReceipt(mark int64, epoch uint64) limiter.Receipt {
	return limiter.Receipt{At: mark, Mark: mark, Epoch: epoch}
}

// denied is the refusal of global a pool repeats, its times counted down.
func denied(sp Spent) limiter.Decision {
	dn := sp.Denial
	elapsed := sp.Now - dn.Made
	d := limiter.Decision{
		Remaining:  dn.Remaining,
		RetryAfter: max(time.Microsecond, time.Duration(dn.Retry-elapsed)*time.Microsecond),
		ResetAfter: max(0, time.Duration(dn.Reset-elapsed)*time.Microsecond),
	}
	if dn.Time != 0 {
		d.Time = dn.Time + elapsed
	}
	return d
}

// refill asks global for the key's next batch, the pool having given the
// caller its lock (sp), installs it and spends the request's units from
// it. Neither call is cancelled with the request: the region's other
// instances wait for the batch, and each store bounds its own calls.
func (s *Store) refill(ctx context.Context, key string, cost, want int64, token string, sp Spent) (limiter.Admission, error) {
	ctx = context.WithoutCancel(ctx)
	var a limiter.Admission
	var err error
	if rest := s.lateRest(sp.Units, sp.Now-sp.Batch.Expires); rest > 0 {
		back := limiter.Return{Key: key, Units: rest, Taken: globalReceipt(sp.Batch.Mark, sp.Batch.Epoch)}
		a, err = s.global.Renew(ctx, back, cost, sp.Want)
		if err == nil {
			s.returned(rest)
		} else {
			s.failed(fmt.Errorf("%d unspent units of a lapsed batch may not have been returned to global: %w", rest, err))
		}
	} else {
		a, err = s.global.TakeUpTo(ctx, key, cost, sp.Want)
	}
	if err != nil {
		if uerr := s.pool.Unlock(ctx, key, token); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return limiter.Admission{}, fmt.Errorf("regional store: global: %w", err)
	}
	sent := sp.Now
	if !a.Allowed {
		d := a.Decision
		f := PoolFill{Batch: Batch{Sent: sent}, Denied: true, Denial: Denial{
			Made: sent, Until: sent + min(d.RetryAfter, denyFor).Microseconds(),
			Remaining: d.Remaining, Retry: d.RetryAfter.Microseconds(), Reset: d.ResetAfter.Microseconds(), Time: d.Time,
		}}
		if rep, ferr := s.pool.Fill(ctx, key, token, f); ferr == nil && rep.Ours {
			s.giveBackOld(key, rep)
		}
		return limiter.Admission{Decision: d}, nil
	}
	granted := a.Receipt.Granted
	if s.onRefill != nil {
		s.onRefill(granted)
	}
	mine := min(want, granted)
	b := Batch{
		Units:     granted - mine,
		Sent:      sent,
		Expires:   s.expires(sent, a.Time),
		Mark:      a.Receipt.Name(),
		Epoch:     a.Receipt.Epoch,
		Time:      a.Time,
		Remaining: a.Remaining,
		Reset:     a.ResetAfter.Microseconds(),
		// A sliding log's batch takes units back only if global logged
		// it a lifetime ahead: logged at its grant, a unit spent again up
		// to a lifetime later would leave the window that much early.
		TakesBack: s.alg != limiter.SlidingWindowLog || a.Receipt.Name()-a.Receipt.At >= s.life,
	}
	if s.alg == limiter.TokenBucket {
		// The bucket's receipts name nothing global needs; the claim's
		// time tells the region's batches apart.
		b.Mark = sent
	}
	rep, err := s.pool.Fill(ctx, key, token, PoolFill{Batch: b})
	switch {
	case err != nil:
		// The batch may or may not be in the pool: its units stay
		// counted in global until its state lapses, an under-admission.
		s.failed(fmt.Errorf("%d units of a batch may not have reached the region's pool: %w", b.Units, err))
	case !rep.Ours:
		// The lock lapsed and another instance refilled (or an admin
		// reset ran): the batch is not installed, and its units are not
		// returned either, since a reset may have erased what counted them.
		s.failed(fmt.Errorf("%d units of a batch outlived its refill lock and stay unspent", b.Units))
	default:
		s.giveBackOld(key, rep)
		// Tracked even when empty: units spent from it may come back
		// into it, and must reach global when it lapses.
		s.track(key, b, sent)
	}
	d := a.Decision
	d.Remaining = min(s.quota, d.Remaining+b.Units)
	d.Source = limiter.SourceStore
	return limiter.NewAdmission(s, key, mine, d, s.receipt(a.Time, b, mine)), nil
}

// expires is when a batch claimed at sent (the pool's µs) and granted by
// global at gt (global's µs) lapses: a lifetime after sent, and for the
// window counters no later than the end of global's window, counted from
// sent (before global decided, so never later than that end).
func (s *Store) expires(sent, gt int64) int64 {
	e := sent + s.life
	switch {
	case s.window > 0 && gt > 0:
		e = min(e, sent+s.window-gt%s.window)
	case s.cal != nil && gt > 0:
		_, end := s.cal.At(gt)
		e = min(e, sent+end-gt)
	}
	return e
}

// track notes a batch this instance installed, for its janitor: it lapses
// b.Expires − sent after now on the instance's clock.
func (s *Store) track(key string, b Batch, sent int64) {
	lapses := s.now() + (b.Expires - sent)
	s.mu.Lock()
	s.filled[key] = filledBatch{mark: b.Mark, epoch: b.Epoch, lapses: lapses}
	s.mu.Unlock()
}

// lateRest is what goes back to global of units, the rest of a batch
// that lapsed late µs ago. A token bucket credits a return in full
// whenever it comes, though it refilled meanwhile: tokens returned long
// after their grant could pass on top of B + r×T + r×Lifetime, up to r ×
// the delay. The janitor returns a lapsed batch within janitorEvery
// (lateGrace allows a tick as late again); a rest that waited longer
// (its installer died or closed, and a refill or a late sweep found it)
// goes back less what the bucket refilled in the time past lateGrace:
// an under-admission of at most those units instead. The window
// counters and the log credit the window or entry a return names, so
// theirs go back whole.
func (s *Store) lateRest(units, late int64) int64 {
	over := late - lateGrace.Microseconds()
	if s.alg != limiter.TokenBucket || units <= 0 || over <= 0 {
		return max(0, units)
	}
	if over/s.rateW >= units {
		return 0 // the bucket refilled at least a unit per window: all of them
	}
	// ⌈over × L / W⌉, rounded up: the safe side.
	refilled := over/s.rateW*s.rateL + (over%s.rateW*s.rateL+s.rateW-1)/s.rateW
	return max(0, units-refilled)
}

// giveBackOld returns to global what the batch a fill replaced still held.
func (s *Store) giveBackOld(key string, rep Filled) {
	if rep.Old <= 0 {
		return
	}
	s.returnToGlobal([]limiter.Return{{Key: key, Units: rep.Old, Taken: globalReceipt(rep.OldMark, rep.OldEpoch)}})
}

// returnToGlobal sends returns to global off the request path.
func (s *Store) returnToGlobal(returns []limiter.Return) {
	if s.syncReturns {
		s.returnNow(returns)
		return
	}
	s.returning.Add(1)
	go func() {
		defer s.returning.Done()
		s.returnNow(returns)
	}()
}

// returnNow sends returns to global and waits for its answer.
func (s *Store) returnNow(returns []limiter.Return) {
	var units int64
	for _, r := range returns {
		units += r.Units
	}
	if err := s.global.ReturnMany(context.Background(), returns); err != nil {
		s.failed(fmt.Errorf("returning %d units of %d batches to global: %w", units, len(returns), err))
		return
	}
	s.returned(units)
}

func (s *Store) returned(units int64) {
	if s.onReturn != nil && units > 0 {
		s.onReturn(units)
	}
}

func (s *Store) failed(err error) {
	if s.onError != nil {
		s.onError(err)
	}
}

func (s *Store) now() int64 { return s.clock.Now().UnixMicro() }

// GiveBack implements limiter.Store: units go back into the batch they
// were spent from while it lasts (no call to global), else to global,
// naming the grant, into the window or log entry that counted them.
func (s *Store) GiveBack(ctx context.Context, key string, units int64, taken limiter.Receipt) (limiter.Decision, error) {
	if units < 1 {
		return limiter.Decision{}, fmt.Errorf("regional store: giving back %d units", units)
	}
	mark := taken.Name()
	ok, err := s.pool.Back(ctx, key, units, mark, taken.Epoch)
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("regional store: giving back to the region's pool: %w", err)
	}
	if ok {
		return s.Peek(ctx, key)
	}
	d, err := s.global.GiveBack(ctx, key, units, globalReceipt(mark, taken.Epoch))
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("regional store: giving back to global: %w", err)
	}
	s.returned(units)
	return d, nil
}

// ReturnMany implements limiter.Leaser: each return as GiveBack would, those
// for global in one call.
func (s *Store) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	var toGlobal []limiter.Return
	var errs []error
	for _, r := range returns {
		mark := r.Taken.Name()
		ok, err := s.pool.Back(ctx, r.Key, r.Units, mark, r.Taken.Epoch)
		if err != nil {
			errs = append(errs, fmt.Errorf("regional store: returning %d units to the region's pool: %w", r.Units, err))
			continue
		}
		if !ok {
			toGlobal = append(toGlobal, limiter.Return{Key: r.Key, Units: r.Units, Taken: globalReceipt(mark, r.Taken.Epoch)})
		}
	}
	if len(toGlobal) > 0 {
		if err := s.global.ReturnMany(ctx, toGlobal); err != nil {
			errs = append(errs, fmt.Errorf("regional store: returning to global: %w", err))
		} else {
			var units int64
			for _, r := range toGlobal {
				units += r.Units
			}
			s.returned(units)
		}
	}
	return errors.Join(errs...)
}

// Renew implements limiter.Leaser: the return, then the take. An error
// from the return stops before the take; either way the caller must not
// return the units again.
func (s *Store) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	if err := s.ReturnMany(ctx, []limiter.Return{back}); err != nil {
		return limiter.Admission{}, err
	}
	return s.TakeUpTo(ctx, back.Key, cost, want)
}

// Charge implements limiter.Charger: the region's units pay first (global
// counted them), the rest is charged to global directly, past its limit
// if need be, as a near cache charges (docs/design.md).
func (s *Store) Charge(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	if s.charger == nil {
		return limiter.Admission{}, errors.New("regional store: global cannot charge past its limit")
	}
	sp, err := s.pool.Spend(ctx, key, PoolSpend{Cost: cost, Want: cost, Pay: true})
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("regional store: the region's pool: %w", err)
	}
	if sp.Units == cost {
		a := s.spent(key, sp, 0)
		return limiter.Admission{Decision: a.Decision, Receipt: limiter.Receipt{At: a.Receipt.At, Mark: a.Receipt.Mark, Epoch: a.Receipt.Epoch, Granted: cost}}, nil
	}
	a, err := s.charger.Charge(ctx, key, cost-sp.Units)
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("regional store: global: %w", err)
	}
	a.Receipt.Granted += sp.Units
	return a, nil
}

// Peek implements limiter.Store: global's state plus the units the
// region's batch still holds.
func (s *Store) Peek(ctx context.Context, key string) (limiter.Decision, error) {
	d, err := s.global.Peek(ctx, key)
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("regional store: global: %w", err)
	}
	ps, err := s.pool.Peek(ctx, key)
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("regional store: the region's pool: %w", err)
	}
	if ps.Now < ps.Batch.Expires {
		d.Remaining = min(s.quota, d.Remaining+ps.Batch.Units)
	}
	return d, nil
}

// Inspect is what an operator sees of a key: global's state (Global) and
// the region's batch as the pool holds it.
type Inspect struct {
	Global limiter.Decision
	// Units the region's batch holds, spendable for Lapses more.
	Units  int64
	Lapses time.Duration
	// Denied is how long the region still repeats global's refusal.
	Denied time.Duration
}

// Inspect reports key's state in global and in the region's pool.
func (s *Store) Inspect(ctx context.Context, key string) (Inspect, error) {
	g, err := s.global.Peek(ctx, key)
	if err != nil {
		return Inspect{}, fmt.Errorf("regional store: global: %w", err)
	}
	ps, err := s.pool.Peek(ctx, key)
	if err != nil {
		return Inspect{}, fmt.Errorf("regional store: the region's pool: %w", err)
	}
	out := Inspect{Global: g}
	if ps.Now < ps.Batch.Expires {
		out.Units = ps.Batch.Units
		out.Lapses = time.Duration(ps.Batch.Expires-ps.Now) * time.Microsecond
	}
	if ps.Now < ps.Denial.Until {
		out.Denied = time.Duration(ps.Denial.Until-ps.Now) * time.Microsecond
	}
	return out, nil
}

// Reset implements limiter.Store: it forgets the region's batch and
// global's state. The pool is forgotten before global's reset and again
// after it, as a near cache forgets its key (docs/design.md): a refill
// another instance of the region claims in between may bring units
// global granted before its reset, and installed they would be spent
// after it, uncounted by the fresh state. A refill global decides just
// after its reset loses its batch so (the units stay counted, unspent,
// until global's state lapses): at most one batch of under-admission.
// Other regions' batches were counted before the reset and are spent or
// returned as they would have been: right after a reset, up to what they
// hold may pass on top of the limit.
func (s *Store) Reset(ctx context.Context, key string) (bool, error) {
	held, err := s.forget(ctx, key)
	if err != nil {
		return false, err
	}
	existed, err := s.global.Reset(ctx, key)
	if err != nil {
		return held, fmt.Errorf("regional store: global: %w", err)
	}
	again, err := s.forget(ctx, key)
	if err != nil {
		return existed || held, err
	}
	return existed || held || again, nil
}

// forget drops key's batch, lock and refusal from the region's pool, and
// this instance's note of the batch.
func (s *Store) forget(ctx context.Context, key string) (bool, error) {
	held, err := s.pool.Reset(ctx, key)
	if err != nil {
		return false, fmt.Errorf("regional store: the region's pool: %w", err)
	}
	s.mu.Lock()
	delete(s.filled, key)
	s.mu.Unlock()
	return held, nil
}

var (
	_ limiter.Leaser  = (*Store)(nil)
	_ limiter.Charger = (*Store)(nil)
)

// Package nearcache keeps leases and refusals of a shared store (the Redis
// store) in this process: a Cache in front of any limiter.Leaser decides
// most requests of a busy limit without a round trip, while every unit it
// admits is still taken from the shared store first.
package nearcache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// nearShards is how many independently locked tables a Cache splits
// its keys over.
const nearShards = 32

// Options configures a Cache.
type Options struct {
	// LeaseFraction is the largest share of the quota one lease may
	// hold, in (0, 1]: a lease holds at most ⌈LeaseFraction × Q⌉ units,
	// where Q is the policy's quota (Burst for a token bucket, else
	// Events). Zero takes no leases.
	LeaseFraction float64
	// DenyFor is the longest a refusal from the shared store is repeated
	// from memory (the denial cache); zero repeats none.
	DenyFor time.Duration
	// MaxKeys bounds the keys the cache remembers; a key beyond it is
	// decided by the shared store alone. Zero means DefaultMaxKeys.
	MaxKeys int
	// Clock is read on every decision; nil means the system clock.
	Clock limiter.Clock
	// OnGiveBackError, when set, hears of unspent units a give-back could
	// not return (they stay taken in the shared store until its state
	// expires), so the caller can log it.
	OnGiveBackError func(error)
	// Reclaim, when set (with leases), asks the other instances sharing
	// the store to return their leases of the key named name (see Name):
	// the cache calls it when the store refuses it a lease, at most once
	// per LeaseLifetime per key, and then repeats that refusal for at most
	// ReclaimDeny, so the units that come back are asked for soon. It
	// must not block. The other instances answer with ReturnNamed.
	Reclaim func(name string)
	// Name is a key's name among the instances, which every instance
	// computes alike and which reveals nothing of the key (the Redis
	// store's Key); required with Reclaim.
	Name func(key string) string

	// manualSweep keeps the janitor from starting, so a test decides
	// when sweeps run (Cache.sweep) and schedules stay deterministic.
	manualSweep bool
	// goAhead, when set, is handed each refill ahead of key (run) instead
	// of a goroutine running it, and goBack each give-back of a retired
	// lease, so a test decides when they run.
	goAhead func(key string, run func())
	goBack  func(run func())
	// waiting, when set, hears of a request about to wait for the refill
	// of key under way, so a test can let that refill answer.
	waiting func(key string)
	// queued, when set, hears of a lease request of key that joined its
	// lane's queue (lanes.go), and goGroup is handed each group call of
	// the asks of keys (run) instead of a goroutine running it, so a test
	// decides when groups are sent.
	queued  func(key string)
	goGroup func(keys []string, run func())
}

// Cache keeps leases and refusals in this process in front of a shared
// store (a near cache), so most decisions of a busy limit need no round
// trip while every admitted unit is still taken from the shared store
// first:
//
//   - Leases: when a key's lease cannot cover a request, the cache takes
//     units for it with one Leaser.TakeUpTo, starting at the request's
//     cost and doubling while leases are used up within a second of their
//     grant, up to ⌈LeaseFraction × Q⌉; later requests spend them in
//     memory. A lease lives at most LeaseLifetime (a fixed window's never
//     past its window's end, a calendar window's included); then, and at
//     Close, its unspent units are given back to the store: by the
//     janitor, every quarter of a lifetime, many in one call
//     (Leaser.ReturnMany), or by the call that takes the key's next lease
//     (Leaser.Renew) when a request comes first.
//   - Denial cache: a refusal from the store is repeated from memory, its
//     times counted down, until the smaller of its RetryAfter and DenyFor
//     has passed.
//   - Group commit: when the store takes the leases of several keys in
//     one call (limiter.LeaseBatcher), a lease request that finds another
//     under way on its lane waits for it, and those that waited go in the
//     next call together (lanes.go).
//
// Across any number of instances admissions therefore never exceed the
// limit; under-admission is bounded by what other instances hold in leases,
// for at most LeaseLifetime. docs/design.md says more.
type Cache struct {
	store limiter.Leaser
	// batcher is store as a LeaseBatcher, nil when it takes no leases in
	// groups; lanes are the group commits of its lease requests
	// (lanes.go).
	batcher limiter.LeaseBatcher
	lanes   [cacheLanes]nearLane
	// charger is store as a Charger, nil when it cannot charge.
	charger  limiter.Charger
	leasing  bool
	maxLease int64
	quota    int64
	// window, when set, is the aligned window (µs) a lease must not
	// outlive: see leaseTraits.endsWithWindow. cal is set instead for
	// a calendar policy, whose windows it gives.
	window int64
	cal    *limiter.CalendarWindows
	// logsLeasesAhead: see leaseTraits.logsAhead; returnsCredit: see
	// leaseTraits.returnsCredit.
	logsLeasesAhead bool
	returnsCredit   bool
	denyFor         int64 // µs
	maxKeys         int64
	keys            atomic.Int64
	clock           clock
	seed            maphash.Seed
	shards          [nearShards]nearShard
	// gens numbers the leases the cache grants (nearKey.gen).
	gens            atomic.Uint64
	onGiveBackError func(error)

	closed   atomic.Bool
	stop     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{} // closed when the janitor has returned
	// givingBack counts the give-backs under way, so Close returns only
	// when nothing is left to refund; aheads the refills ahead under way,
	// and refills the refills requests asked for, whose answers Close
	// waits for as well (they give back what they bring once the cache
	// is closed, a refill whose requester left included). All three are
	// added to under a shard's lock with the cache open, so before Close's
	// sweep has passed that shard, and so before Close waits.
	givingBack sync.WaitGroup
	aheads     sync.WaitGroup
	refills    sync.WaitGroup
	// rtt is the round trip of lease requests (µs), a moving average over
	// every key: how early a refill ahead must start (aheadDue).
	rtt atomic.Int64
	// reclaim and name are Options.Reclaim and Name; names maps the name
	// of each key the cache remembers to the key, for ReturnNamed
	// (nearKey.name), when they are set.
	reclaim func(name string)
	name    func(key string) string
	names   sync.Map
	// The test hooks of Options.
	goAhead func(key string, run func())
	goBack  func(run func())
	waiting func(key string)
	queued  func(key string)
	goGroup func(keys []string, run func())
}

type nearShard struct {
	mu   sync.Mutex
	keys map[string]*nearKey
	// resets counts the admin resets of the shard's keys, so a refusal
	// the store made before one is not cached after it (takeFromStore):
	// a key decided without leases may not be remembered while its take
	// is under way. Per shard, not per key: a reset of another key costs
	// a refusal of this one its caching, no more.
	resets uint64
	// backs orders give-backs against admin resets: held for reading by
	// every call that returns units of the shard's keys to the store (the
	// janitor's and Close's ReturnMany, GiveBack's, a renewal), from the
	// check that their key was not reset since the units left its lease
	// until the store has answered; for writing by Reset, around the
	// store's reset. So units taken before a reset reach the store before
	// it, into the state it erases, or not at all: never into the fresh
	// state, which never counted them. Never acquired with mu held.
	backs sync.RWMutex
}

// nearBack is units of a lease on their way back to the store: their
// return, the key they came from and its shard's index.
type nearBack struct {
	limiter.Return
	k     *nearKey
	shard int
}

// nearLease is one grant of the store's units that a key spends from.
type nearLease struct {
	// units is the lease's unspent units, spendable until expires (µs).
	units   int64
	expires int64
	// atWindowEnd is set when expires is the end of the grant's window
	// rather than a lifetime after the request for it was sent.
	atWindowEnd bool
	// grant is the store's decision that granted the lease, at grantAt
	// (µs) on the cache's clock; gen names the lease among every lease
	// the cache ever granted (from Cache.gens, zero before the first),
	// so a refund finds the lease its units came from and no other: not
	// the lease of a key forgotten and remembered since, nor one granted
	// after a reset.
	grant   limiter.Admission
	grantAt int64
	gen     uint64
	// since is when the lease became the one spent from (its grant, or
	// the promotion of a lease refilled ahead): its spending rate counts
	// from there (aheadDue).
	since int64
}

// covers reports whether the lease pays cost at now.
func (l *nearLease) covers(cost, now int64) bool {
	return l.units >= cost && now < l.expires
}

// granted is how many units the store granted the lease.
func (l *nearLease) granted() int64 { return l.grant.Receipt.Granted }

// nearKey is what the cache knows of one key. Its fields are guarded by its
// shard's lock.
type nearKey struct {
	// nearLease is the lease spent from.
	nearLease
	// next is a lease refilled ahead (refillAhead), spent once the
	// current one cannot pay a request: it is then promoted, and what
	// the current one still holds is given back to its own grant. Every
	// unit a key holds on an instance, in both leases and in a refill
	// ahead under way (reserved), is at most max(⌈LeaseFraction × Q⌉,
	// the grant's cost): the bound on what an instance strands.
	next nearLease
	// reserved is what the refill ahead under way asked for.
	reserved int64
	// size is the next lease's size, before the cost floor (see
	// nextSize); streak counts the key's leases in a row, each asked
	// within 2 lifetimes of the one before; aheadFor is the lease a
	// refill ahead was last started for, so each lease starts one at
	// most, whatever it brings.
	size     int64
	streak   int
	aheadFor uint64
	// returns counts ReturnLease's returns of the key: a refill ahead
	// that answers after one gives back what it brings.
	returns uint64
	// denial is the store's refusal repeated until deniedUntil (µs); it
	// was made at deniedAt.
	denial      limiter.Decision
	deniedAt    int64
	deniedUntil int64
	// refill is the lease request under way (asked by a request, or
	// ahead), which requests that find the lease short wait for instead
	// of asking the store again: one per key at most.
	refill *nearRefill
	// forgotten is set when an admin reset drops the key (Cache.forget)
	// while a refill may be under way: what the store answers it was
	// decided before the reset, so it is neither spent nor cached; and
	// units of the key not yet given back are not given back.
	forgotten bool
	// pendingBacks counts give-backs of the key's units collected and not
	// yet sent (nearBack): the janitor keeps the key while any is, so a
	// reset meanwhile finds it and marks it forgotten.
	pendingBacks int
	// used is when the key was last decided (µs), for the janitor.
	used int64
	// name is the key's name among the instances (Options.Name), indexed
	// in Cache.names while the cache remembers the key; reclaimedAt is
	// when this instance last asked the others for the key's leases (µs).
	name        string
	reclaimedAt int64
}

// held is the units the key holds in its leases.
func (k *nearKey) held() int64 { return k.units + k.next.units }

// nearRefill is a lease request under way.
type nearRefill struct {
	done chan struct{}
	d    limiter.Admission
	err  error
	// again is set when a reset forgot the key before the request was
	// sent, and for every refill ahead: the requests waiting for it ask
	// afresh (a refill ahead leaves its lease, if any, as the key's next).
	again bool
}

// New puts a Cache in front of store, enforcing p (the
// store's policy). Close it to give back its leases.
func New(store limiter.Leaser, p limiter.Policy, opts Options) (*Cache, error) {
	params, err := p.Compile()
	if err != nil {
		return nil, fmt.Errorf("near cache: %w", err)
	}
	f := opts.LeaseFraction
	if f < 0 || f > 1 || math.IsNaN(f) {
		return nil, fmt.Errorf("near cache: lease fraction %v outside (0, 1]", f)
	}
	if f > 0 && !p.Algorithm.Traits().Leases {
		return nil, fmt.Errorf("near cache: %s does not lease", p.Algorithm)
	}
	if opts.DenyFor < 0 {
		return nil, fmt.Errorf("near cache: negative deny duration %v", opts.DenyFor)
	}
	if opts.Reclaim != nil && (opts.Name == nil || f == 0) {
		return nil, errors.New("near cache: reclaiming leases needs leases and a name for each key")
	}
	q, _ := p.Quota()
	c := &Cache{
		store:           store,
		leasing:         f > 0,
		maxLease:        int64(math.Ceil(f * float64(q))),
		quota:           q,
		denyFor:         opts.DenyFor.Microseconds(),
		maxKeys:         int64(opts.MaxKeys),
		clock:           clock{opts.Clock},
		seed:            maphash.MakeSeed(),
		onGiveBackError: opts.OnGiveBackError,
		stop:            make(chan struct{}),
		stopped:         make(chan struct{}),
		goAhead:         opts.goAhead,
		reclaim:         opts.Reclaim,
		name:            opts.Name,
		goBack:          opts.goBack,
		waiting:         opts.waiting,
		queued:          opts.queued,
		goGroup:         opts.goGroup,
	}
	c.batcher, _ = store.(limiter.LeaseBatcher)
	if p.Algorithm.Traits().Charges {
		c.charger, _ = store.(limiter.Charger)
	}
	lt := leaseTraitsOf[p.Algorithm]
	if lt.endsWithWindow {
		if params.Windows != nil {
			c.cal = params.Windows
		} else {
			c.window = params.W
		}
	}
	c.logsLeasesAhead = lt.logsAhead
	c.returnsCredit = lt.returnsCredit
	if c.maxKeys <= 0 {
		c.maxKeys = limiter.DefaultMaxKeys
	}
	for i := range c.shards {
		c.shards[i].keys = make(map[string]*nearKey)
	}
	if opts.manualSweep {
		close(c.stopped)
	} else {
		go c.janitor()
	}
	return c, nil
}

func (c *Cache) shard(key string) *nearShard {
	return &c.shards[c.shardIndex(key)]
}

func (c *Cache) shardIndex(key string) int {
	return int(maphash.String(c.seed, key) % nearShards)
}

// Take implements Store: from the key's lease or its cached refusal when
// they answer, else from the store.
func (c *Cache) Take(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	if c.closed.Load() {
		return c.store.Take(ctx, key, cost)
	}
	si := c.shardIndex(key)
	sh := &c.shards[si]
	for {
		now := c.clock.now()
		sh.mu.Lock()
		k := sh.keys[key]
		if k != nil {
			k.used = now
			if now < k.deniedUntil {
				d := k.cachedDenial(now)
				sh.mu.Unlock()
				return limiter.Admission{Decision: d}, nil
			}
			if !k.covers(cost, now) && k.next.units > 0 {
				// The lease refilled ahead takes over; what the current
				// one holds goes back to its grant.
				backs := c.promote(k, key, si, now)
				sh.mu.Unlock()
				c.giveBackRetired(backs)
				continue
			}
			if k.covers(cost, now) {
				k.units -= cost
				a := c.leaseAdmission(k, now)
				ahead := c.aheadDue(k, key, si, cost, now)
				sh.mu.Unlock()
				c.startAhead(ahead)
				a = holding(a, c, key, cost)
				return a, nil
			}
			if r := k.refill; r != nil {
				// Another request, or a refill ahead, is asking the store
				// for this key: wait for its answer rather than ask again.
				sh.mu.Unlock()
				if c.waiting != nil {
					c.waiting(key)
				}
				select {
				case <-r.done:
				case <-ctx.Done():
					return limiter.Admission{}, fmt.Errorf("near cache: waiting for a lease: %w", ctx.Err())
				}
				if r.again {
					continue
				}
				if r.err != nil {
					return limiter.Admission{}, r.err
				}
				if !r.d.Allowed {
					return r.d, nil
				}
				continue // spend from the new lease, or ask for the next
			}
		}
		if !c.leasing {
			resets := sh.resets
			sh.mu.Unlock()
			return c.takeFromStore(ctx, sh, key, cost, resets)
		}
		if k == nil {
			if k = c.remember(sh, key, now); k == nil {
				sh.mu.Unlock()
				return c.store.Take(ctx, key, cost)
			}
		}
		if a, again, err := c.refill(ctx, sh, si, k, key, cost, now); !again {
			return a, err
		}
	}
}

// drop stops remembering key, whose nearKey is k, in sh, whose lock is
// held.
func (c *Cache) drop(sh *nearShard, key string, k *nearKey) {
	delete(sh.keys, key)
	c.keys.Add(-1)
	if k.name != "" {
		c.names.Delete(k.name)
	}
}

// remember starts remembering key, whose lock is held, unless the
// cache already holds MaxKeys keys: then it returns nil, and the key is
// decided by the store alone.
func (c *Cache) remember(sh *nearShard, key string, now int64) *nearKey {
	if c.keys.Load() >= c.maxKeys {
		return nil
	}
	k := &nearKey{used: now}
	sh.keys[key] = k
	c.keys.Add(1)
	if c.reclaim != nil {
		k.name = c.name(key)
		c.names.Store(k.name, key)
	}
	return k
}

// takeFromStore asks the store alone (no leases) and caches a refusal,
// unless a key of sh was reset since resets (sh.resets when the request
// was sent) was read: the refusal may be of the state the reset forgot.
func (c *Cache) takeFromStore(ctx context.Context, sh *nearShard, key string, cost int64, resets uint64) (limiter.Admission, error) {
	d, err := c.store.Take(ctx, key, cost)
	if err != nil || d.Allowed || c.denyFor == 0 {
		return d, err
	}
	now := c.clock.now()
	sh.mu.Lock()
	if sh.resets != resets {
		sh.mu.Unlock()
		return d, nil
	}
	k := sh.keys[key]
	if k == nil {
		k = c.remember(sh, key, now)
	}
	if k != nil {
		k.used = now
		k.cacheDenial(d.Decision, now, c.denyFor)
	}
	sh.mu.Unlock()
	return d, nil
}

// refill asks the store for a new lease for k, whose shard (sh, index si)
// is locked and is unlocked on return, and spends cost from it. now is
// when the request was sent, read before the store's clock decided: the
// lease's lifetime (and a window's end) is measured from it, not from
// when the answer came, so however slow the reply, the lease is spent
// only while the store's clock is within a lifetime of the grant and, for
// the window counters, within the grant's window. It reports again,
// having asked nothing, when a reset forgot the key before the request
// could be sent: the caller asks afresh. The request may wait in its
// lane's queue (lanes.go) until ctx ends; it then fails, and the refill
// goes on for the key without it.
func (c *Cache) refill(ctx context.Context, sh *nearShard, si int, k *nearKey, key string, cost, now int64) (d limiter.Admission, again bool, err error) {
	if c.closed.Load() {
		// Close ran since Take looked: the store decides alone.
		sh.mu.Unlock()
		d, err = c.store.Take(ctx, key, cost)
		return d, false, err
	}
	c.refills.Add(1) // with the cache open and the shard locked: see refills
	want := c.nextSize(k, cost, now, false)
	leftover, grant := k.units, k.grant
	k.units, k.expires = 0, 0
	r := &nearRefill{done: make(chan struct{})}
	k.refill = r
	sh.mu.Unlock()

	// Not cancelled with the request that asks: others may wait for the
	// answer. The store bounds the call with its own timeout. What the
	// last lease left goes back in the same call, before the take.
	a := &nearAsk{LeaseAsk: limiter.LeaseAsk{Key: key, Cost: cost, Want: want}, ctx: context.WithoutCancel(ctx)}
	if leftover > 0 {
		// A give-back, ordered against resets (nearShard.backs): if one
		// forgot the key since the units left its lease, it erased them,
		// and the request starts afresh. Held until the store answers.
		sh.backs.RLock()
		sh.mu.Lock()
		gone := k.forgotten
		if gone {
			k.refill = nil
			r.again = true
		}
		sh.mu.Unlock()
		if gone {
			sh.backs.RUnlock()
			close(r.done)
			c.refills.Done()
			return limiter.Admission{}, true, nil
		}
		a.Back = limiter.Return{Key: key, Units: leftover, Taken: grant.Receipt}
	}
	f := refillAnswer{c: c, sh: sh, si: si, k: k, r: r, a: a, sent: now}
	a.unhold, a.left = f.unhold, func() { f.take(false) }
	if !c.ask(ctx, a) {
		return limiter.Admission{}, false, fmt.Errorf("near cache: waiting to ask for a lease: %w", ctx.Err())
	}
	d, err = f.take(true)
	return d, false, err
}

// refillAnswer is a request's refill (Cache.refill) whose store answered
// a: its requester, or the goroutine that delivered the answer if the
// requester left, takes it.
type refillAnswer struct {
	c    *Cache
	sh   *nearShard
	si   int
	k    *nearKey
	r    *nearRefill
	a    *nearAsk
	sent int64
}

// unhold ends the give-back the ask carried (a renewal's, ordered against
// resets by its shard's backs lock, held until the store answered).
func (f refillAnswer) unhold() {
	a := f.a
	if a.Back.Units == 0 {
		return
	}
	f.sh.backs.RUnlock()
	if a.err != nil && f.c.onGiveBackError != nil {
		f.c.onGiveBackError(fmt.Errorf("%d unspent units of a lease may not have been given back: %w", a.Back.Units, a.err))
	}
}

// take makes the answer the key's lease or cached refusal, and, for the
// requester (asked), spends the request's cost from the lease and
// returns the request's admission; a refill whose requester left keeps
// the whole lease for the key's next requests, if they may spend it
// (spendsAhead), else gives it back. The requester unholds
// the give-back first; for one that left, settle has done so already.
func (f refillAnswer) take(asked bool) (limiter.Admission, error) {
	c, sh, k, a, key, cost := f.c, f.sh, f.k, f.a, f.a.Key, f.a.Cost
	defer c.refills.Done() // last: after the give-back of a closed cache
	if asked {
		f.unhold()
	}
	d, err := a.d, a.err
	sent := f.sent
	now := c.clock.now()
	c.noteRoundTrip(now - sent)

	var ahead *nearAhead
	reclaim := false
	sh.mu.Lock()
	k.refill = nil
	f.r.d, f.r.err = d, err
	switch {
	case err != nil:
	case k.forgotten:
		// An admin reset ran while the store answered: the grant or
		// refusal was decided on the state it forgot (or, if the store
		// decided after its reset, on the fresh state: the units are then
		// stranded until the window or state ends, an under-admission).
		// The request itself was decided before the reset ended and
		// stands; the rest of the lease is neither spent nor given back,
		// since giving it back would credit the fresh state with units it
		// never counted.
		if d.Allowed {
			d = holding(d, c.store, key, cost)
			d.Receipt.Granted = cost
			d.Source = limiter.SourceStore
		}
	case !d.Allowed:
		deny := c.denyFor
		if c.reclaim != nil && now-k.reclaimedAt >= limiter.LeaseLifetime.Microseconds() {
			// Other instances may hold units of the key in leases: ask
			// for them, and ask the store again soon.
			k.reclaimedAt, reclaim = now, true
			deny = min(deny, ReclaimDeny.Microseconds())
		}
		if deny > 0 {
			k.cacheDenial(d.Decision, now, deny)
		}
	default:
		k.nearLease = c.newLease(d, sent, now)
		if asked {
			k.units -= cost
			d = c.leaseAdmission(k, now)
			d = holding(d, c, key, cost)
			d.Source = limiter.SourceStore
		}
		ahead = c.aheadDue(k, key, f.si, cost, now)
	}
	if k.units > 0 && (c.closed.Load() || !asked && !c.spendsAhead(k.grant.Receipt)) {
		// Close ran while the store answered: give back now, on this
		// request (or the goroutine that answered its requester, gone),
		// before the refill counts as done: Close waits for refills, and
		// its sweep found this key's lease still being asked for. So does
		// a lease whose requester left that later requests may not spend,
		// as a refill ahead's would (a sliding log's grant the store did
		// not log ahead: TestNearCacheLeftRefillNotLoggedAheadGoesBack).
		back := nearBack{limiter.Return{Key: key, Units: k.units, Taken: k.grant.Receipt}, k, f.si}
		k.units, k.expires = 0, 0
		k.pendingBacks++
		defer c.giveBackNow([]nearBack{back})
	}
	name := k.name
	sh.mu.Unlock()
	close(f.r.done)
	c.startAhead(ahead)
	if reclaim {
		c.reclaim(name)
	}
	if err != nil {
		return limiter.Admission{}, err
	}
	return d, nil
}

// newLease is the lease the store's grant d makes: numbered, its
// decision's times counting on from the answer at now (the store decided
// no later), its lifetime from the send.
func (c *Cache) newLease(d limiter.Admission, sent, now int64) nearLease {
	l := nearLease{units: d.Receipt.Granted, grant: d, grantAt: now, since: now, gen: c.gens.Add(1)}
	l.expires = sent + limiter.LeaseLifetime.Microseconds()
	end := l.expires
	if c.window > 0 && d.Time > 0 {
		end = sent + c.window - d.Time%c.window
	}
	if c.cal != nil && d.Time > 0 {
		_, e := c.cal.At(d.Time)
		end = sent + e - d.Time
	}
	if end < l.expires {
		l.expires, l.atWindowEnd = end, true
	}
	return l
}

// leaseAdmission is the admission of a request spent from k's lease at
// now, holding nothing yet: the store's remaining when it granted the
// lease plus what the lease still holds (this instance's best knowledge,
// never above the quota), and the store's reset counted down. Its receipt
// names the lease and the grant, whose window or log entry (and whose
// state, by its epoch) its units belong to.
func (c *Cache) leaseAdmission(k *nearKey, now int64) limiter.Admission {
	elapsed := max(0, now-k.grantAt)
	a := limiter.Admission{Decision: limiter.Decision{
		Allowed:    true,
		Remaining:  min(c.quota, k.grant.Remaining+k.units),
		ResetAfter: max(0, k.grant.ResetAfter-microseconds(elapsed)),
		Source:     limiter.SourceLease,
		Time:       k.grant.Time,
	}, Receipt: limiter.Receipt{At: k.grant.Receipt.At, Mark: k.grant.Receipt.Name(), Lease: k.gen, Epoch: k.grant.Receipt.Epoch}}
	if a.Time != 0 {
		a.Time += elapsed
		a.Receipt.At += elapsed
	}
	return a
}

// cacheDenial remembers the store's refusal d, made at now, for the
// smaller of its RetryAfter and denyFor.
func (k *nearKey) cacheDenial(d limiter.Decision, now, denyFor int64) {
	k.denial, k.deniedAt = d, now
	k.deniedUntil = now + min(d.RetryAfter.Microseconds(), denyFor)
}

// cachedDenial is the remembered refusal as it stands at now: its times
// counted down.
func (k *nearKey) cachedDenial(now int64) limiter.Decision {
	elapsed := now - k.deniedAt
	d := k.denial
	d.ResetAfter = max(0, d.ResetAfter-microseconds(elapsed))
	d.RetryAfter = max(time.Microsecond, d.RetryAfter-microseconds(elapsed))
	d.Source = limiter.SourceDenyCache
	if d.Time != 0 {
		d.Time += elapsed
	}
	return d
}

// GiveBack implements Store. Units spent from a lease go back into it
// while it lasts, so a request another zone refused costs no round trip;
// else they go back to the store. A sliding log's lease takes them back
// only if the store logged it a lifetime ahead: a grant of the request's
// cost alone is logged at its time, and a unit of it spent again up to a
// lifetime later would leave the window that much early.
func (c *Cache) GiveBack(ctx context.Context, key string, units int64, taken limiter.Receipt) (limiter.Decision, error) {
	if taken.Lease != 0 && !c.closed.Load() {
		now := c.clock.now()
		sh := c.shard(key)
		sh.mu.Lock()
		if k := sh.keys[key]; c.takesBack(k, taken, units, now) {
			k.units += units
			a := c.leaseAdmission(k, now)
			sh.mu.Unlock()
			return a.Decision, nil
		}
		sh.mu.Unlock()
	}
	return c.store.GiveBack(ctx, key, units, taken)
}

// takesBack reports whether a give-back of units of taken goes back into
// k's lease at now (see GiveBack); k's shard is locked. While a lease
// refilled ahead is held or asked for, only as many as keep the key's
// units on this instance within the bound of a lease (see nearKey.next):
// the rest go to the store.
func (c *Cache) takesBack(k *nearKey, taken limiter.Receipt, units, now int64) bool {
	if k == nil || taken.Lease == 0 || k.gen != taken.Lease || now >= k.expires {
		return false
	}
	if ahead := k.next.units + k.reserved; ahead > 0 && k.units+ahead+units > max(c.maxLease, k.granted()) {
		return false
	}
	return c.spendsAhead(k.grant.Receipt)
}

// Charge implements Charger. The units the key's lease here still holds
// pay first: the store counted them when it granted the lease, so spending
// them on the charge owes nothing, as spending them on requests would not,
// and a charge the lease covers costs no round trip. The rest is taken
// from the store directly, past its limit if need be (an overdraft, which
// a lease never holds), so every instance sees the debt at its next
// round trip; a later lease is refused until time has repaid it. Units
// other instances hold in leases were counted before the charge and stay
// theirs to spend: with the charge they are what the store admits in the
// window. An error from the store means the lease's part was charged and
// the rest was not.
func (c *Cache) Charge(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	if c.charger == nil {
		return limiter.Admission{}, errors.New("near cache: the store cannot charge past its limit")
	}
	var paid int64
	if c.leasing && cost > 0 && !c.closed.Load() {
		now := c.clock.now()
		sh := c.shard(key)
		sh.mu.Lock()
		if k := sh.keys[key]; k != nil && k.units > 0 && now < k.expires {
			k.used = now
			paid = min(k.units, cost)
			k.units -= paid
			if paid == cost {
				a := c.leaseAdmission(k, now)
				a.Receipt.Granted = paid
				sh.mu.Unlock()
				return a, nil
			}
		}
		sh.mu.Unlock()
	}
	a, err := c.charger.Charge(ctx, key, cost-paid)
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("near cache: %w", err)
	}
	a.Receipt.Granted += paid
	return a, nil
}

// Peek implements Store: the store's state plus what this instance's
// leases of the key (the current one and one refilled ahead) still hold,
// as a lease decision reports it.
func (c *Cache) Peek(ctx context.Context, key string) (limiter.Decision, error) {
	d, err := c.store.Peek(ctx, key)
	if err != nil {
		return limiter.Decision{}, err
	}
	now := c.clock.now()
	sh := c.shard(key)
	sh.mu.Lock()
	if k := sh.keys[key]; k != nil {
		if now < k.expires {
			d.Remaining = min(c.quota, d.Remaining+k.units)
		}
		if now < k.next.expires {
			d.Remaining = min(c.quota, d.Remaining+k.next.units)
		}
	}
	sh.mu.Unlock()
	return d, nil
}

// giveBack refunds leases' unspent units to the store, off the request
// path, in as few calls as the store allows. Each refund's Taken is the
// decision that granted the lease, which names the window or log entry its
// units belong to. The caller has added one to givingBack for it, before
// it took the units out of their leases, so that whoever sees the leases
// empty and then waits for givingBack also waits for their give-back.
func (c *Cache) giveBack(backs []nearBack) {
	go func() {
		defer c.givingBack.Done()
		c.giveBackNow(backs)
	}()
}

// giveBackNow sends backs to the store, but for those of keys a reset has
// forgotten since their units left the lease (the reset erased them). It
// holds the backs lock of every shard involved (in order, each once) until
// the store has answered, so no reset of their keys runs meanwhile.
func (c *Cache) giveBackNow(backs []nearBack) {
	var involved [nearShards]bool
	for _, b := range backs {
		involved[b.shard] = true
	}
	for i, in := range involved {
		if in {
			c.shards[i].backs.RLock()
		}
	}
	defer func() {
		for i, in := range involved {
			if in {
				c.shards[i].backs.RUnlock()
			}
		}
	}()
	returns := make([]limiter.Return, 0, len(backs))
	for _, b := range backs {
		sh := &c.shards[b.shard]
		sh.mu.Lock()
		b.k.pendingBacks--
		gone := b.k.forgotten
		sh.mu.Unlock()
		if !gone {
			returns = append(returns, b.Return)
		}
	}
	if len(returns) == 0 {
		return
	}
	if err := c.store.ReturnMany(context.Background(), returns); err != nil && c.onGiveBackError != nil {
		var units int64
		for _, b := range returns {
			units += b.Units
		}
		c.onGiveBackError(fmt.Errorf("returning %d unspent units of %d leases: %w", units, len(returns), err))
	}
}

// janitor gives back the units of expired leases and forgets keys that
// have nothing left to remember, every quarter of a lease's lifetime.
func (c *Cache) janitor() {
	defer close(c.stopped)
	tick := time.NewTicker(limiter.LeaseLifetime / 4)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			c.sweep(false)
		}
	}
}

// sweep gives back expired leases, current or refilled ahead (every lease
// when all is set, as Close does), and forgets idle keys. It locks one
// shard at a time.
func (c *Cache) sweep(all bool) {
	idleFor := 2 * limiter.LeaseLifetime.Microseconds()
	var backs []nearBack
	for i := range c.shards {
		sh := &c.shards[i]
		now := c.clock.now()
		sh.mu.Lock()
		for key, k := range sh.keys {
			for _, l := range []*nearLease{&k.nearLease, &k.next} {
				if l.units == 0 || !all && now < l.expires {
					continue
				}
				if len(backs) == 0 {
					c.givingBack.Add(1) // see giveBack
				}
				if !all {
					k.wasted(l)
				}
				backs = append(backs, nearBack{limiter.Return{Key: key, Units: l.units, Taken: l.grant.Receipt}, k, i})
				l.units, l.expires = 0, 0
				k.pendingBacks++
			}
			if k.held() == 0 && k.refill == nil && k.pendingBacks == 0 && now >= k.deniedUntil && now-k.used >= idleFor {
				c.drop(sh, key, k)
			}
		}
		sh.mu.Unlock()
	}
	if len(backs) > 0 {
		c.giveBack(backs)
	}
}

// Close gives back every lease's unspent units and stops the cache's
// goroutine; it waits for the give-backs until ctx is done. The cache
// still decides afterwards, by the store alone: Caddy may route requests
// on old connections to a handler after its Cleanup.
func (c *Cache) Close(ctx context.Context) error {
	c.closeLeases()
	return c.waitClosed(ctx)
}

// closeLeases is the first half of Close: no lease is spent or refilled
// from here on, and every lease is given back (in the background).
func (c *Cache) closeLeases() {
	c.closed.Store(true)
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.stopped // no sweep runs after this one
	c.sweep(true)
}

// waitClosed is the second half of Close: it waits for the give-backs and
// the refills ahead under way until ctx is done.
func (c *Cache) waitClosed(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.refills.Wait()
		c.aheads.Wait()
		c.givingBack.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return errors.Join(errors.New("near cache: leases still being given back"), ctx.Err())
	}
}

// ReclaimDeny is the longest a refusal is repeated from the denial cache
// once the instance asked the others for the key's leases
// (Options.Reclaim): about what their answer takes, so a unit they return
// is admitted within tens of milliseconds.
const ReclaimDeny = 50 * time.Millisecond

// Len is how many keys the cache remembers.
func (c *Cache) Len() int { return int(c.keys.Load()) }

var _ limiter.Store = (*Cache)(nil)
var _ limiter.Charger = (*Cache)(nil)

// ReturnLease returns the unspent units of key's leases (the current one,
// one refilled ahead, and what a refill ahead under way brings) to the
// store and forgets its cached refusal, because key's requests are now
// decided by another limit (an override was set, changed or removed):
// units leased under one limit are never spent under another. It waits
// for the return until ctx is done, but not for a refill ahead under way,
// which gives back on its own when it answers.
func (c *Cache) ReturnLease(ctx context.Context, key string) error {
	return c.returnLeases(ctx, key, false)
}

// ReturnNamed returns the unspent units of the leases of the key whose
// name (Options.Name) is name, as ReturnLease does, if the cache holds
// any: another instance was refused the key and asked for them
// (Options.Reclaim). The key's next lease is half the size: demand for it
// is elsewhere too.
func (c *Cache) ReturnNamed(ctx context.Context, name string) error {
	key, ok := c.names.Load(name)
	if !ok {
		return nil
	}
	return c.returnLeases(ctx, key.(string), true)
}

// returnLeases is ReturnLease; shrink halves the key's next lease.
func (c *Cache) returnLeases(ctx context.Context, key string, shrink bool) error {
	sh := c.shard(key)
	// Held from before the units leave the lease until the store has
	// them, so no reset runs between (nearShard.backs).
	sh.backs.RLock()
	defer sh.backs.RUnlock()
	var back []limiter.Return
	var units int64
	sh.mu.Lock()
	if k := sh.keys[key]; k != nil {
		back, units = k.surrender(key, nil)
		if shrink {
			k.size = max(1, k.size/2)
		} else {
			k.deniedUntil = 0 // a refusal under the old limit
		}
	}
	sh.mu.Unlock()
	if len(back) == 0 {
		return nil
	}
	if err := c.store.ReturnMany(ctx, back); err != nil {
		return fmt.Errorf("returning %d unspent units of key's leases: %w", units, err)
	}
	return nil
}

// surrender empties k's leases (k's shard is locked), the current one
// and one refilled ahead, for a return to the store, and makes a refill
// ahead under way give back what it brings (nearKey.returns): every
// place the key holds units. It appends their returns to back and
// reports them with their units. ReturnLease, ReturnNamed and
// ReturnLeasesWithPrefix all return through it, so none forgets a lease.
func (k *nearKey) surrender(key string, back []limiter.Return) ([]limiter.Return, int64) {
	var units int64
	for _, l := range []*nearLease{&k.nearLease, &k.next} {
		if l.units > 0 {
			back = append(back, limiter.Return{Key: key, Units: l.units, Taken: l.grant.Receipt})
			units += l.units
		}
		l.units, l.expires = 0, 0
	}
	k.returns++
	return back, units
}

// leaseTraits is what the cache must know of how the stores count an
// algorithm's leases.
type leaseTraits struct {
	// endsWithWindow is set when a lease must not outlive the aligned
	// window it was granted in: the counters' units belong to that window,
	// and spent in the next one they would join that window's own L.
	endsWithWindow bool
	// logsAhead is set when the stores log a lease's units a lifetime
	// ahead of its grant (the sliding log), so a unit must not be spent
	// from a lease that was not: see Cache.GiveBack.
	logsAhead bool
	// returnsCredit is set when units given back are credited when they
	// come (the token bucket), not to the window or log entry that took
	// them, so they must come back soon after their grant: see
	// aheadTimeout.
	returnsCredit bool
}

// leaseTraitsOf describes the algorithms that lease (limiter.Traits.Leases);
// the others have none.
var leaseTraitsOf = map[limiter.Algorithm]leaseTraits{
	limiter.FixedWindow:          {endsWithWindow: true},
	limiter.SlidingWindowLog:     {logsAhead: true},
	limiter.SlidingWindowCounter: {endsWithWindow: true},
	limiter.TokenBucket:          {returnsCredit: true},
}

// holding is a when it refused; when it admitted, a holding held units of
// key in s, the store its units go back to.
func holding(a limiter.Admission, s limiter.Store, key string, held int64) limiter.Admission {
	if !a.Allowed {
		return a
	}
	return limiter.NewAdmission(s, key, held, a.Decision, a.Receipt)
}

// Start of the process on both clocks; see clock.now.
var (
	processStart   = time.Now()
	processStartUs = processStart.UnixMicro()
)

// clock is the cache's Options.Clock, read as the memory store reads its
// own: see now.
type clock struct{ c limiter.Clock }

// now is the cache's time in µs. Without an injected clock it is the wall
// clock at process start advanced by the monotonic clock, as in the
// memory store: time.Since reads one clock where time.Now reads two, and
// not following steps of the wall clock keeps leases from lapsing early
// or late when it is set.
func (mc *clock) now() int64 {
	if mc.c == nil {
		return processStartUs + time.Since(processStart).Microseconds()
	}
	return mc.c.Now().UnixMicro()
}

// microseconds converts a count of µs to a Duration.
func microseconds(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}

// ReturnLeasesWithPrefix is ReturnLease for every key the cache holds
// that starts with prefix, because a prefix override was set, changed or
// removed: both leases of each key, and what a refill ahead under way
// brings (nearKey.surrender). It visits the shards one at a time, each returned in one call
// to the store, and waits for the returns until ctx is done.
func (c *Cache) ReturnLeasesWithPrefix(ctx context.Context, prefix string) error {
	var errs []error
	for i := range c.shards {
		if err := c.returnShardLeases(ctx, &c.shards[i], prefix); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// returnShardLeases is ReturnLeasesWithPrefix for one shard, holding its
// backs lock as ReturnLease does.
func (c *Cache) returnShardLeases(ctx context.Context, sh *nearShard, prefix string) error {
	sh.backs.RLock()
	defer sh.backs.RUnlock()
	var back []limiter.Return
	var units int64
	sh.mu.Lock()
	for key, k := range sh.keys {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		var n int64
		back, n = k.surrender(key, back)
		units += n
		k.deniedUntil = 0 // a refusal under the old limit
	}
	sh.mu.Unlock()
	if len(back) == 0 {
		return nil
	}
	if err := c.store.ReturnMany(ctx, back); err != nil {
		return fmt.Errorf("returning %d unspent units of %d leases: %w", units, len(back), err)
	}
	return nil
}

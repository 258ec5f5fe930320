package nearcache

import (
	"context"
	"fmt"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Refill ahead. A key whose lease runs out waits a round trip for the
// next one, so a steadily used key used to wait once per lease: with
// 20 ms to Redis, its p99 was the round trip. Instead, a busy key's lease
// is refilled in the background while requests keep spending it:
//
//   - When a spend leaves a lease low (aheadDue), one refill ahead starts
//     for the key (at most one refill of a key is under way per instance:
//     nearKey.refill, which requests that find the lease short wait for,
//     as for any refill), and at most one per lease.
//   - Its grant is kept apart as the key's next lease (nearKey.next): the
//     grants stay distinct, since each receipt names its own window or log
//     entry. When the current lease cannot pay a request (spent, or
//     expired), the next one is promoted (promote) and what the current
//     one still holds goes back to its own grant, by a give-back off the
//     request path (giveBackRetired).
//   - A refill ahead that fails or is refused changes nothing: the key
//     decides on what it holds, then asks the store as any refill does
//     (and the fail mode applies to that request).
//   - Exactness is per lease, as before: a lease refilled ahead is spent
//     only within a lifetime of its request's send and, for the window
//     counters, within its grant's window; a sliding log's is spent only
//     if the store logged it a lifetime ahead; every unspent unit goes
//     back to the grant it came from (the janitor, Close, ReturnLease) or
//     is dropped by an admin reset, which waits for a refill ahead under
//     way (as for a give-back: nearShard.backs) and then forgets its
//     lease with the others. And the units a key holds on an
//     instance, both leases and the refill ahead under way together, stay
//     within max(⌈LeaseFraction × Q⌉, the grant's cost), so refilling
//     ahead strands no more than one lease did.
//
// docs/design.md ("The near cache") says more.

// aheadStreak is how many leases in a row (each asked within 2 lifetimes
// of the one before) a key has had before it is refilled ahead: one seen
// a few times costs no call more.
const aheadStreak = 3

// aheadSlack is added to twice the round trip when judging whether a
// lease runs out, or expires, before a refill ahead could answer.
const aheadSlack = 5_000 // µs

// aheadTimeout bounds a token bucket's refill ahead, whatever the store's
// own timeout: its units go back (or are spent) within a lifetime and a
// quarter of the grant, as a lease's do. Units given back to a bucket
// later than that would be credited after it had refilled over them: more
// than the lease slack (docs/design.md, "What it guarantees"). A refill
// that slow comes too late to spare a wait anyway. The windows' units go
// back to their own window or log entry whenever they come, so their
// refills ahead are bounded by the store's timeout alone: one that times
// out after the store granted strands its units until the state ends.
const aheadTimeout = limiter.LeaseLifetime / 4

// nearAhead is a refill ahead ready to start, once the shard is unlocked.
type nearAhead struct {
	sh               *nearShard
	si               int
	k                *nearKey
	r                *nearRefill
	key              string
	cost, want, sent int64
	// returns is nearKey.returns when it started.
	returns uint64
}

// aheadDue starts a refill ahead of k (shard si, locked) if the spend of
// cost at now left its lease low, and returns it, to be sent once the
// lock is released (startAhead); nil if none is due. Due, for a key whose
// last leases came in a row (a streak of aheadStreak), when no refill is
// under way and no next lease is held, once per lease, when:
//   - the lease is spent, or
//   - at the rate it has been spent since it became current (spent − 1
//     units in the time since the first: a rate needs two spends), it
//     runs out within two round trips (Cache.rtt) and a little, or
//   - it expires by its lifetime within two round trips and a little (a
//     lease that ends with its window is not refilled ahead for that: a
//     grant before the window ends would end with it too).
//
// As late as that, not at a fixed share of the lease such as half: the
// refill may bring no more than the room the current lease leaves under
// the bound, so the later it starts, the larger the next lease and the
// fewer the calls; and a refill ahead that its key never spends (its
// requests stopped) is a call and a give-back for nothing, which the
// streak makes rare: under BenchmarkNearCacheRedisZipf's traffic,
// refilling at a quarter left and from a streak of 2 cost a tenth more
// script calls than no refill ahead at all; as late as this and from a
// streak of 3, a tenth fewer (fewer requests find a lease short).
//
// The refill asks for the next size (nextSize), no more than what keeps
// the key's units on this instance within max(⌈LeaseFraction × Q⌉, cost),
// and at least the cost; none starts when that does not fit, or, for a
// sliding log, when it would not exceed the cost (the store logs only a
// lease of more than its cost a lifetime ahead, and the units of one that
// is not logged ahead must be spent at once: see Cache.GiveBack).
func (c *Cache) aheadDue(k *nearKey, key string, si int, cost, now int64) *nearAhead {
	if k.refill != nil || k.next.units > 0 || k.aheadFor == k.gen || k.streak < aheadStreak || c.closed.Load() {
		return nil
	}
	if !c.spendsAhead(k.grant.Receipt) {
		// A sliding log's lease that the store did not log ahead: the
		// next would most likely not be either (a regional store never
		// logs one, as regional.Store.TakeUpTo grants a log the cost
		// alone; the Redis store logs a lease of more than its cost,
		// which this one could not get), and a grant not logged ahead
		// goes back as soon as it comes: a call and a give-back for
		// nothing.
		return nil
	}
	granted, left := k.granted(), k.units
	margin := 2*c.rtt.Load() + aheadSlack
	spent, elapsed := granted-left, now-k.since
	switch {
	case left == 0:
	case spent >= 2 && left*elapsed <= (spent-1)*margin:
	case !k.atWindowEnd && now+margin >= k.expires:
	default:
		return nil
	}
	if k.atWindowEnd && now+margin >= k.expires {
		return nil // its grant would lapse with the window
	}
	size, streak := c.sizeFor(k, cost, now, true)
	want := min(max(size, cost), max(c.maxLease, cost)-left)
	if want < cost || (c.logsLeasesAhead && want <= cost) {
		return nil
	}
	k.size, k.streak = size, streak
	k.aheadFor = k.gen
	k.reserved = want
	r := &nearRefill{done: make(chan struct{}), again: true}
	k.refill = r
	c.aheads.Add(1) // with the cache open and the shard locked: see aheads
	return &nearAhead{sh: &c.shards[si], si: si, k: k, r: r, key: key, cost: cost, want: want, sent: now, returns: k.returns}
}

// spendsAhead reports whether units of the grant r may be spent later
// than the request that took them: always, but for a sliding log, whose
// store must have logged the grant a lifetime ahead (see Cache.GiveBack).
func (c *Cache) spendsAhead(r limiter.Receipt) bool {
	return !c.logsLeasesAhead || r.Name()-r.At >= limiter.LeaseLifetime.Microseconds()
}

// startAhead sends a refill ahead that aheadDue started, if any, off the
// request path.
func (c *Cache) startAhead(a *nearAhead) {
	if a == nil {
		return
	}
	if c.goAhead != nil {
		c.goAhead(a.key, func() { c.refillAhead(a) })
		return
	}
	go c.refillAhead(a)
}

// refillAhead asks the store for the key's next lease and keeps it as
// nearKey.next. It is ordered against admin resets as give-backs are
// (nearShard.backs): a reset waits for its answer, which is then dropped
// with the key's leases, so what it took is erased with the state it was
// taken from, never stranded in the fresh one; and one that starts after
// a reset forgot the key asks nothing. Its answer is given back at once
// when the cache was closed or the key's leases were returned
// (ReturnLease) since it was sent, or when it may not be spent (a sliding
// log's grant not logged ahead), or when it answers too late to be spent
// at all.
func (c *Cache) refillAhead(a *nearAhead) {
	defer c.aheads.Done()
	k, sh := a.k, a.sh
	sh.backs.RLock()
	defer sh.backs.RUnlock()
	sh.mu.Lock()
	if k.forgotten {
		k.refill, k.reserved = nil, 0
		sh.mu.Unlock()
		close(a.r.done)
		return
	}
	sh.mu.Unlock()
	// The request that started it has its answer already: nothing waits
	// for this one but requests that find the lease short, and they are
	// not cancelled with it. The store bounds the call with its timeout,
	// and so does aheadTimeout. It may wait in its lane's queue, and go
	// in a group with other keys' (lanes.go).
	ask := &nearAsk{LeaseAsk: limiter.LeaseAsk{Key: a.key, Cost: a.cost, Want: a.want}}
	if c.returnsCredit {
		ask.bound = aheadTimeout
	}
	c.ask(context.Background(), ask)
	d, err := ask.d, ask.err
	now := c.clock.now()
	c.noteRoundTrip(now - a.sent)
	var back []limiter.Return
	sh.mu.Lock()
	k.refill, k.reserved = nil, 0
	a.r.d, a.r.err = d, err
	if err == nil && d.Allowed && !k.forgotten {
		l := c.newLease(d, a.sent, now)
		spendable := c.spendsAhead(d.Receipt)
		if c.closed.Load() || k.returns != a.returns || !spendable || now >= l.expires || k.next.units > 0 {
			back = []limiter.Return{{Key: a.key, Units: l.units, Taken: l.grant.Receipt}}
		} else {
			k.next = l
		}
	}
	sh.mu.Unlock()
	close(a.r.done)
	if len(back) > 0 {
		// Still ordered against resets: the key cannot have been forgotten
		// since it was found not to be.
		if err := c.store.ReturnMany(context.Background(), back); err != nil && c.onGiveBackError != nil {
			c.onGiveBackError(fmt.Errorf("returning %d units of a lease refilled ahead: %w", back[0].Units, err))
		}
	}
}

// promote makes k's next lease (refilled ahead) the current one, when the
// current one cannot pay a request at now; k's shard, of index si, is
// locked. What the current lease still holds goes back to its grant; a
// next lease that expired unspent goes back instead of being promoted.
// It returns those give-backs, to be sent once the lock is released
// (giveBackRetired), having counted them in givingBack (with the cache
// open: Close's sweep emptied every lease of a closed cache).
func (c *Cache) promote(k *nearKey, key string, si int, now int64) []nearBack {
	var backs []nearBack
	retire := func(l *nearLease) {
		if l.units == 0 {
			return
		}
		if now >= l.expires {
			k.wasted(l)
		}
		backs = append(backs, nearBack{limiter.Return{Key: key, Units: l.units, Taken: l.grant.Receipt}, k, si})
		k.pendingBacks++
		l.units, l.expires = 0, 0
	}
	if now >= k.next.expires {
		retire(&k.next)
	} else {
		retire(&k.nearLease)
		k.nearLease, k.next = k.next, nearLease{}
		k.since = now
	}
	if len(backs) > 0 {
		c.givingBack.Add(1)
	}
	return backs
}

// giveBackRetired sends what promote retired, off the request path.
func (c *Cache) giveBackRetired(backs []nearBack) {
	if len(backs) == 0 {
		return
	}
	if c.goBack != nil {
		c.goBack(func() {
			defer c.givingBack.Done()
			c.giveBackNow(backs)
		})
		return
	}
	c.giveBack(backs)
}

// noteRoundTrip adds one lease request's round trip (µs) to Cache.rtt,
// an exponential moving average weighing the newest an eighth.
func (c *Cache) noteRoundTrip(us int64) {
	us = max(us, 0)
	for {
		old := c.rtt.Load()
		avg := us
		if old > 0 {
			avg = old + (us-old)/8
		}
		if c.rtt.CompareAndSwap(old, avg) {
			return
		}
	}
}

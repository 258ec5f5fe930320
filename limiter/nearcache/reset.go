package nearcache

import "context"

// Reset implements Store: it forgets this instance's lease and cached
// refusal of key, then the store's state, then again whatever the cache
// learned of the key meanwhile. The lease's units are dropped, not given
// back: they belong to the state being forgotten. So is every answer the
// store sent before its reset ended: a lease or refusal whose request was
// under way is never spent or repeated after the reset (a request sent to
// the store between the two forgets may have been decided before the
// store's reset). Leases other instances hold are given back into the
// fresh state when they lapse, so right after a reset up to that many
// units more may pass. It reports that state existed when the store held
// some, or this instance a lease's units or a refusal still in force.
//
// Reset is StartReset, ResetStore and End in a row. Several caches of one
// process in front of one state (handlers that declare the same zone)
// reset it together with those, so that none keeps a lease another's
// store reset erased: see StartReset.
func (c *Cache) Reset(ctx context.Context, key string) (bool, error) {
	r := c.StartReset(key)
	defer r.End()
	return r.ResetStore(ctx)
}

// Resetting is an admin reset of one key of a Cache under way: from
// StartReset, which forgets the key, to End, which forgets it again, no
// unit of the key's shard goes back to the store (nearShard.backs).
type Resetting struct {
	c    *Cache
	key  string
	sh   *nearShard
	held bool
	done bool
}

// StartReset starts an admin reset of key (see Reset): it forgets the
// key's leases and cached refusal and holds back every give-back of its
// shard until End. The caller resets the store's state with ResetStore
// and must call End, once every store of the reset has been reset.
//
// Caches of one process that reset one state as one admin reset (the
// admin API answers for every handler declaring a zone) start their
// resets before any store's reset and end them after the last: each
// reset alone would let a cache whose reset ended take a lease from the
// state between two stores' resets, and spend it after the admin reset
// ended, beside the fresh limit. Started together, a lease any of
// them took before the last store's reset is forgotten at End, and no
// unit leased before it reaches the fresh state. Start them in one
// order (the handlers'), since each holds a lock until End.
func (c *Cache) StartReset(key string) *Resetting {
	// No give-back of the shard's units is under way from here on: those
	// sent have reached the store, and those not sent are dropped if they
	// are key's (nearShard.backs).
	sh := c.shard(key)
	sh.backs.Lock()
	return &Resetting{c: c, key: key, sh: sh, held: c.forget(key)}
}

// ResetStore resets key's state in the cache's store. It reports that
// state existed when the store held some, or the cache a lease's units or
// a refusal in force when the reset started. Even when it fails the
// store's reset may have run, so End must still follow.
func (r *Resetting) ResetStore(ctx context.Context) (bool, error) {
	existed, err := r.c.store.Reset(ctx, r.key)
	return existed || r.held, err
}

// End forgets again whatever the cache learned of the key since the reset
// started (leases the store granted meanwhile, which the store's reset
// may have erased, and refusals), then lets give-backs of the shard run.
// Dropping a lease costs an under-admission at most. A second End does
// nothing.
func (r *Resetting) End() {
	if r.done {
		return
	}
	r.done = true
	r.c.forget(r.key)
	r.sh.backs.Unlock()
}

// forget drops key for an admin reset (see Reset): its leases, its cached
// refusal, and what a refill under way (asked by a request, or ahead)
// brings back (nearKey.forgotten). It reports whether the key held a
// lease's units or a refusal in force.
func (c *Cache) forget(key string) bool {
	now := c.clock.now()
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.resets++
	k := sh.keys[key]
	if k == nil {
		return false
	}
	held := k.held() > 0 || now < k.deniedUntil
	// Removed even while a refill is under way: requests that come after
	// the reset must not wait for an answer decided before it, but ask
	// the store afresh. The refill still wakes those already waiting.
	c.drop(sh, key, k)
	k.units, k.expires, k.deniedUntil = 0, 0, 0
	k.next = nearLease{}
	k.forgotten = true
	return held
}

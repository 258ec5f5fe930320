package jwtauth

import "sync"

// cacheShards splits the verified-token cache so concurrent requests
// rarely meet on one lock.
const cacheShards = 16

// evictionSample is how many entries are looked at to choose a victim.
const evictionSample = 8

// cache remembers the outcome of verifying a token, so a client sending the
// same token on every request pays for one signature check, not one per
// request. It is bounded: each shard holds at most perShard entries and,
// when full, evicts the entry closest to expiry among a few sampled ones
// (Go map iteration starts at a random place, so the sample is random).
// Entries are keyed by a seeded hash of the whole token, and the token
// itself is compared on a hit, so neither a prefix nor a hash collision can
// return another token's claims.
type cache struct {
	perShard int
	shards   [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[uint64]cacheEntry
	_  [32]byte // pad to 64 bytes: neighbouring shards' locks on separate cache lines
}

type cacheEntry struct {
	token string
	// claims is nil for a cached failure.
	claims Claims
	// expires is the UnixNano instant the entry stops being valid.
	expires int64
	// gen is the key set generation the outcome was computed under.
	gen uint64
}

func newCache(capacity int) *cache {
	c := &cache{perShard: max(1, (capacity+cacheShards-1)/cacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[uint64]cacheEntry)
	}
	return c
}

// get returns the cached outcome for token (hashed to h) if it is still
// valid at now under key set generation gen. hit is false when nothing
// usable is cached.
func (c *cache) get(h uint64, token string, now int64, gen uint64) (claims Claims, hit bool) {
	s := &c.shards[h%cacheShards]
	s.mu.RLock()
	e, found := s.m[h]
	s.mu.RUnlock()
	if !found || e.gen != gen || now >= e.expires || e.token != token {
		return nil, false
	}
	return e.claims, true
}

// put stores an outcome until expires (UnixNano).
func (c *cache) put(h uint64, token string, claims Claims, expires int64, gen uint64) {
	s := &c.shards[h%cacheShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.m[h]; !exists && len(s.m) >= c.perShard {
		var (
			victim  uint64
			soonest int64
			seen    int
		)
		for k, e := range s.m {
			exp := e.expires
			if e.gen != gen {
				exp = 0 // computed under keys no longer in use: worthless
			}
			if seen == 0 || exp < soonest {
				victim, soonest = k, exp
			}
			if seen++; seen == evictionSample {
				break
			}
		}
		delete(s.m, victim)
	}
	s.m[h] = cacheEntry{token: token, claims: claims, expires: expires, gen: gen}
}

// len counts the entries held, expired ones included.
func (c *cache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

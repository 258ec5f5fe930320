package nearcache

import "github.com/floodgatehq/caddy-ratelimit/limiter"

// Leases sized by demand. A lease that is too small costs a round trip
// per few requests; one that is too large strands units on this instance,
// which other instances cannot admit until it goes back (at most a
// lifetime and a quarter later). So each key's lease follows what it
// spends in a lifetime, never above ⌈LeaseFraction × Q⌉ (but for a
// request that costs more: a lease is at least its request's cost):
//
//   - a key not leased in the last 2 lifetimes (or ever) starts at the
//     request's cost;
//   - a lease used up within a lifetime of its grant doubles the next one
//     (for a refill ahead, asked before the lease is used up: a lease
//     whose spending rate since it became current would use it up within
//     a lifetime);
//   - a lease of which more than half goes back unspent (it expired, or
//     was refilled ahead and never spent) halves the next one (for a
//     refill ahead: one whose rate would leave more than half unspent at
//     the end of a lifetime);
//   - otherwise the size stays.
//
// So a key settles between half and twice what it spends in a lifetime,
// and a key that cools down strands at most about twice its last
// lifetime's spend, halved at each lease that lapses, rather than the
// largest lease it ever had.

// nextSize updates k's size and streak (k's shard is locked) for a lease
// asked at now by a request of cost, or by a refill ahead started by one,
// and returns the units to ask for: the size, at least the cost, at most
// ⌈LeaseFraction × Q⌉ unless the cost is more.
func (c *Cache) nextSize(k *nearKey, cost, now int64, ahead bool) int64 {
	k.size, k.streak = c.sizeFor(k, cost, now, ahead)
	return min(max(k.size, cost), max(c.maxLease, cost))
}

// sizeFor is the size and streak nextSize gives k, without changing k.
func (c *Cache) sizeFor(k *nearKey, cost, now int64, ahead bool) (size int64, streak int) {
	life := limiter.LeaseLifetime.Microseconds()
	if k.gen == 0 || now-k.grantAt >= 2*life {
		return cost, 0
	}
	size, streak = k.size, k.streak+1
	granted := k.granted()
	if ahead {
		// The rate since it became current, projected over the lifetime
		// the lease has from there.
		spent, elapsed := granted-k.units, max(1, now-k.since)
		span := max(1, k.expires-k.since)
		switch {
		case spent*span >= granted*elapsed:
			size = min(2*size, c.maxLease)
		case 2*spent*span < granted*elapsed:
			size = max(1, size/2)
		}
	} else if k.units < cost && now-k.grantAt < life {
		size = min(2*size, c.maxLease)
	}
	return size, streak
}

// wasted notes that lease l of k (k's shard is locked) goes back with
// units unspent: more than half of its grant halves the key's next lease.
func (k *nearKey) wasted(l *nearLease) {
	if 2*l.units > l.granted() {
		k.size = max(1, k.size/2)
	}
}

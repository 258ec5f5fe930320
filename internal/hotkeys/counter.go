package hotkeys

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// MaxCapacity is the largest capacity New accepts, so a configuration can
// be refused with a message instead of clamped; the index stores slot
// numbers in 16 bits.
const MaxCapacity = 1 << 15

// generation is how long one generation takes counts. Top answers for the
// current generation and the previous one, so for 30 to 60 seconds back.
const generation = 30 * time.Second

// shardBits is log2 of the number of independently locked shards a key's
// hash (its top bits) picks from, so concurrent requests rarely wait on one
// another. Each shard has the full capacity, which is what keeps counts
// exact up to capacity distinct keys however the hash spreads them.
const shardBits = 3

// Counter estimates, per zone, how often each key was seen and refused in
// the last minute, in memory fixed at construction. It is safe for
// concurrent use.
type Counter struct {
	// epoch is the number of generations since origin, as last read from
	// the clock by Rotate. Add loads it instead of reading the clock.
	epoch    atomic.Int64
	origin   int64
	clock    limiter.Clock
	capacity int
	shards   [1 << shardBits]shard
}

// shard is a pair of space-saving tables, the current generation and the
// previous one, under one lock.
type shard struct {
	mu sync.Mutex
	// epoch is the generation gens[cur] counts.
	epoch int64
	cur   int
	gens  [2]table
	// The padding keeps one shard's lock off the cache line of the next
	// shard's fields.
	_ [64]byte
}

// Entry is one key's estimated counts over the window. They are estimates:
// the true number of requests lies in [Requests-Error, Requests], and the
// true number of refusals in [Denied, Denied+Error].
type Entry struct {
	// Hash identifies the key when its text must not be shown.
	Hash uint64
	// Key is the text Add was given with Hash, for operators who log
	// keys.
	Key string
	// Requests overestimates the key's requests by at most Error.
	Requests uint64
	// Denied counts refusals seen while the key held a counter, so it
	// misses at most Error of them.
	Denied uint64
	// Error bounds the overestimate: what the key inherited when it took
	// over a counter, plus, for a generation that kept no counter for it,
	// that generation's smallest count. It is at most the updates of the
	// key's shard in the window divided by the capacity.
	Error uint64
}

// New returns a Counter with capacity counters per shard and generation
// (clamped to [1, MaxCapacity]): capacity is how many distinct keys a
// generation counts exactly, and what divides the updates in the window to
// bound the error once there are more. Memory is 2×8×capacity counters of
// about 59 bytes (121 KB at 128) plus at most one key string per counter,
// whatever the number of keys. It reads time from clock; nil means the
// system clock.
func New(capacity int, clock limiter.Clock) *Counter {
	capacity = min(max(capacity, 1), MaxCapacity)
	if clock == nil {
		clock = limiter.SystemClock
	}
	c := &Counter{origin: clock.Now().UnixNano(), clock: clock, capacity: capacity}
	for i := range c.shards {
		s := &c.shards[i]
		s.gens = [2]table{newTable(capacity), newTable(capacity)}
	}
	return c
}

// Add counts one request for a key on the request path, without
// allocating and without a lock shared by all keys. hash is a 64-bit hash
// of the key (its top bits choose the shard); key is kept, not copied, only
// while the key holds a counter, so it can be shown. denied says the
// request was refused.
func (c *Counter) Add(hash uint64, key string, denied bool) {
	e := c.epoch.Load()
	s := &c.shards[hash>>(64-shardBits)]
	s.mu.Lock()
	if s.epoch != e {
		s.advance(e)
	}
	s.gens[s.cur].add(hash, key, denied)
	s.mu.Unlock()
}

// Rotate reads the clock and starts a new generation if the current one is
// over. Add does not read the clock (that can cost more than the whole
// update), so counts move between generations only as often as Rotate
// runs: call it every second or so from a goroutine that already ticks.
// Adds since a late call land in a generation that is over, which Top then
// forgets early. Top calls Rotate too, so counts older than a minute never
// show.
func (c *Counter) Rotate() {
	e := max((c.clock.Now().UnixNano()-c.origin)/int64(generation), 0)
	for {
		old := c.epoch.Load()
		if e <= old || c.epoch.CompareAndSwap(old, e) {
			return
		}
	}
}

// Top returns the keys with the most requests in the window, most first,
// at most n of them and at most the capacity, for the admin API. It locks
// one shard at a time, so Add waits at most for one shard's copy.
func (c *Counter) Top(n int) []Entry {
	n = min(n, c.capacity)
	if n <= 0 {
		return nil
	}
	c.Rotate()
	e := c.epoch.Load()
	var out []Entry
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.advance(e)
		out = s.appendEntries(out)
		s.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.Requests != b.Requests {
			return cmp.Compare(b.Requests, a.Requests)
		}
		return cmp.Compare(a.Hash, b.Hash)
	})
	// A copy, so the answer does not hold every shard's entries.
	return slices.Clone(out[:min(n, len(out))])
}

// advance moves the shard to generation e: the current generation becomes
// the previous one, or both are forgotten if e is further ahead.
func (s *shard) advance(e int64) {
	switch {
	case e <= s.epoch:
		return
	case e == s.epoch+1:
		s.cur ^= 1
		s.gens[s.cur].reset()
	default:
		s.gens[0].reset()
		s.gens[1].reset()
	}
	s.epoch = e
}

// appendEntries appends the shard's keys with both generations' counts
// summed. A key has one shard, so no other shard holds counts for it.
func (s *shard) appendEntries(out []Entry) []Entry {
	cur, prev := &s.gens[s.cur], &s.gens[s.cur^1]
	out = cur.appendMerged(out, prev, false)
	return prev.appendMerged(out, cur, true)
}

// appendMerged appends an Entry for each key t counts, adding other's
// counts for it or, if other has no counter for the key, other's smallest
// count to Requests and Error (the key was seen at most that often there).
// If otherDone, other's keys were appended already, with t's counts, so
// keys both count are skipped.
func (t *table) appendMerged(out []Entry, other *table, otherDone bool) []Entry {
	otherMin := other.min()
	for i := range t.slots {
		sl := &t.slots[i]
		if sl.count == 0 {
			continue
		}
		j, inOther := other.find(sl.hash)
		if inOther && otherDone {
			continue
		}
		en := Entry{Hash: sl.hash, Key: t.keys[i], Requests: sl.count, Denied: sl.denied, Error: sl.err}
		if inOther {
			o := &other.slots[j]
			en.Requests += o.count
			en.Error += o.err
			en.Denied += o.denied
		} else {
			en.Requests += otherMin
			en.Error += otherMin
		}
		out = append(out, en)
	}
	return out
}

package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// DefaultMaxKeys bounds a memory store when MemoryOptions.MaxKeys is zero.
const DefaultMaxKeys = 1_000_000

// memoryShards is how many independently locked tables a memory store
// splits its keys over, so concurrent requests for different keys rarely
// wait on one another.
const memoryShards = 64

// MemoryOptions tunes a memory store.
type MemoryOptions struct {
	// MaxKeys bounds the keys kept; beyond it the least recently used key
	// is forgotten (and starts afresh if it comes back). Zero means
	// DefaultMaxKeys.
	MaxKeys int
	// Clock defaults to SystemClock.
	Clock Clock
}

// Memory is the embedded store: the state of each key in this process,
// sharded by a seeded hash of the key so no client can choose collisions,
// bounded by least-recently-used eviction, and swept of idle keys by Sweep.
type Memory struct {
	policy Policy
	p      params
	clock  Clock
	seed   maphash.Seed
	tables memoryTables
}

// memoryTables is the algorithm-specific part of Memory.
type memoryTables interface {
	take(key uint64, p *params, now, cost int64) Decision
	undo(key uint64, p *params, now, cost int64, taken Decision) Decision
	sweep(p *params, now int64) int
	setMaxKeys(n int)
	len() int
}

// NewMemory returns an empty memory store enforcing p.
func NewMemory(p Policy, opts MemoryOptions) (*Memory, error) {
	params, err := p.compile()
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	m := &Memory{policy: p, p: params, clock: opts.Clock, seed: maphash.MakeSeed()}
	if m.clock == nil {
		m.clock = SystemClock
	}
	switch params.alg {
	case TokenBucket, LeakyBucket:
		m.tables = newShardSet[bucketState]()
	case FixedWindow:
		m.tables = newShardSet[fixedWindowState]()
	case SlidingWindowCounter:
		m.tables = newShardSet[slidingCounterState]()
	case SlidingWindowLog:
		m.tables = newShardSet[slidingLogState]()
	case Concurrency:
		m.tables = newShardSet[concurrencyState]()
	}
	m.SetMaxKeys(opts.MaxKeys)
	return m, nil
}

// Policy is the limit this store enforces.
func (m *Memory) Policy() Policy { return m.policy }

// SetMaxKeys changes the bound on keys; a smaller bound takes effect as new
// keys arrive. Zero means DefaultMaxKeys.
func (m *Memory) SetMaxKeys(n int) {
	if n <= 0 {
		n = DefaultMaxKeys
	}
	m.tables.setMaxKeys(n)
}

// Take implements Store; it never fails.
func (m *Memory) Take(_ context.Context, key string, cost int64) (Decision, error) {
	return m.tables.take(maphash.String(m.seed, key), &m.p, m.clock.Now().UnixMicro(), cost), nil
}

// Return implements Store; it never fails. A key forgotten since the Take
// has nothing to give back.
func (m *Memory) Return(_ context.Context, key string, cost int64, taken Decision) (Decision, error) {
	return m.tables.undo(maphash.String(m.seed, key), &m.p, m.clock.Now().UnixMicro(), cost, taken), nil
}

// Sweep forgets every key whose state is back to empty and reports how many
// it forgot. It locks one shard at a time.
func (m *Memory) Sweep() int {
	return m.tables.sweep(&m.p, m.clock.Now().UnixMicro())
}

// Len is how many keys the store holds.
func (m *Memory) Len() int { return m.tables.len() }

// keyState is the per-key state of one algorithm, as a pointer method set.
type keyState[S any] interface {
	*S
	take(p *params, now, cost int64) Decision
	undo(p *params, now, cost int64, taken Decision) Decision
	idle(p *params, now int64) bool
}

// shardSet spreads keys over memoryShards tables by the top bits of their hash.
type shardSet[S any, PS keyState[S]] struct {
	shards [memoryShards]shard[S, PS]
}

func newShardSet[S any, PS keyState[S]]() *shardSet[S, PS] {
	set := &shardSet[S, PS]{}
	for i := range set.shards {
		set.shards[i].index = make(map[uint64]uint32)
	}
	return set
}

func (set *shardSet[S, PS]) shard(key uint64) *shard[S, PS] {
	return &set.shards[key>>(64-6)]
}

func (set *shardSet[S, PS]) take(key uint64, p *params, now, cost int64) Decision {
	sh := set.shard(key)
	sh.mu.Lock()
	d := PS(&sh.slots[sh.get(key)].st).take(p, now, cost)
	sh.mu.Unlock()
	return d
}

func (set *shardSet[S, PS]) undo(key uint64, p *params, now, cost int64, taken Decision) Decision {
	sh := set.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := sh.index[key]
	if !ok {
		var fresh S
		return PS(&fresh).undo(p, now, 0, taken)
	}
	return PS(&sh.slots[i].st).undo(p, now, cost, taken)
}

func (set *shardSet[S, PS]) sweep(p *params, now int64) int {
	n := 0
	for i := range set.shards {
		sh := &set.shards[i]
		sh.mu.Lock()
		for key, j := range sh.index {
			if PS(&sh.slots[j].st).idle(p, now) {
				sh.remove(key, j)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

func (set *shardSet[S, PS]) setMaxKeys(n int) {
	per := (n + memoryShards - 1) / memoryShards
	for i := range set.shards {
		set.shards[i].limit.Store(int64(per))
	}
}

func (set *shardSet[S, PS]) len() int {
	n := 0
	for i := range set.shards {
		sh := &set.shards[i]
		sh.mu.Lock()
		n += len(sh.index)
		sh.mu.Unlock()
	}
	return n
}

// shard is one locked table: a map from key hash to a slot, the slots in a
// slice (no per-key allocation, nothing for the garbage collector to
// trace for fixed-size states), and a doubly linked list through the slots
// in order of use for eviction. Links are slot index + 1; 0 ends a list.
type shard[S any, PS keyState[S]] struct {
	mu    sync.Mutex
	index map[uint64]uint32
	slots []slot[S]
	// newest and oldest are the ends of the use list; free heads the list
	// of unused slots, linked through next.
	newest, oldest, free uint32
	limit                atomic.Int64
	_                    [40]byte // keep neighbouring shards' locks off one cache line
}

type slot[S any] struct {
	key        uint64
	prev, next uint32
	st         S
}

// get returns the slot of key, creating it (and evicting the least recently
// used key when the shard is full) if need be, and marks it most recently used.
func (sh *shard[S, PS]) get(key uint64) uint32 {
	if i, ok := sh.index[key]; ok {
		sh.touch(i)
		return i
	}
	if int64(len(sh.index)) >= sh.limit.Load() && sh.oldest != 0 {
		sh.remove(sh.slots[sh.oldest-1].key, sh.oldest-1)
	}
	var i uint32
	if sh.free != 0 {
		i = sh.free - 1
		sh.free = sh.slots[i].next
		sh.slots[i] = slot[S]{key: key}
	} else {
		i = uint32(len(sh.slots))
		sh.slots = append(sh.slots, slot[S]{key: key})
	}
	sh.index[key] = i
	sh.pushNewest(i)
	return i
}

func (sh *shard[S, PS]) touch(i uint32) {
	if sh.newest == i+1 {
		return
	}
	sh.unlink(i)
	sh.pushNewest(i)
}

func (sh *shard[S, PS]) pushNewest(i uint32) {
	s := &sh.slots[i]
	s.prev, s.next = 0, sh.newest
	if sh.newest != 0 {
		sh.slots[sh.newest-1].prev = i + 1
	}
	sh.newest = i + 1
	if sh.oldest == 0 {
		sh.oldest = i + 1
	}
}

func (sh *shard[S, PS]) unlink(i uint32) {
	s := &sh.slots[i]
	if s.prev != 0 {
		sh.slots[s.prev-1].next = s.next
	} else {
		sh.newest = s.next
	}
	if s.next != 0 {
		sh.slots[s.next-1].prev = s.prev
	} else {
		sh.oldest = s.prev
	}
}

// remove forgets key, whose slot is i, and puts the slot on the free list.
func (sh *shard[S, PS]) remove(key uint64, i uint32) {
	delete(sh.index, key)
	sh.unlink(i)
	sh.slots[i] = slot[S]{next: sh.free}
	sh.free = i + 1
}

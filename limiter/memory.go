package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxKeys bounds a memory store when MemoryOptions.MaxKeys is zero.
const DefaultMaxKeys = 1_000_000

// memoryShards is the most independently locked tables a memory store
// splits its keys over, so concurrent requests for different keys rarely
// wait on one another. It is a power of two: a key's shard is the top bits
// of its hash.
const memoryShards = 64

// minShardKeys is the fewest keys a shard is sized for. Each shard evicts
// on its own, so a shard's share of MaxKeys must be large enough that the
// hash spreads keys evenly over the shards: with shares of a handful of
// keys, one shard would evict while others sat empty, resetting active
// clients' limits far below MaxKeys (and a tiny MaxKeys would keep up to
// memoryShards keys). Below memoryShards×minShardKeys a store uses fewer
// shards; under 2×minShardKeys it uses one, an exact LRU.
const minShardKeys = 1024

// shardBitsFor is log2 of how many shards a store bounded by maxKeys uses.
func shardBitsFor(maxKeys int) uint32 {
	bits := uint32(0)
	for 1<<(bits+1) <= memoryShards && (1<<(bits+1))*minShardKeys <= maxKeys {
		bits++
	}
	return bits
}

// Start of the process on both clocks; see memoryClock.now.
var (
	processStart   = time.Now()
	processStartUs = processStart.UnixMicro()
)

// MemoryOptions tunes a memory store.
type MemoryOptions struct {
	// MaxKeys bounds the keys kept; beyond it the least recently used key
	// is forgotten (and starts afresh if it comes back). Zero means
	// DefaultMaxKeys.
	MaxKeys int
	// Clock is read on every decision. Nil means the wall clock, as
	// SystemClock, but read through the monotonic clock (see
	// memoryClock.now).
	Clock Clock
}

// Memory is the embedded store: the state of each key in this process,
// sharded by a seeded hash of the key so no client can choose collisions,
// bounded by least-recently-used eviction, and swept of idle keys by Sweep.
type Memory struct {
	policy Policy
	// maxCost is policy.MaxCost, the most one Charge may take, kept so a
	// charge does not look the algorithm up again.
	maxCost int64
	p       params
	clock   memoryClock
	seed    maphash.Seed
	tables  memoryTables
}

// memoryTables is the algorithm-specific part of Memory.
type memoryTables interface {
	take(key uint64, p *params, clock *memoryClock, cost, want int64) (t taken, at, mark int64, epoch uint64)
	refund(key uint64, p *params, clock *memoryClock, cost, name int64, epoch uint64) Decision
	charge(key uint64, p *params, clock *memoryClock, cost int64) (t taken, at, mark int64, epoch uint64)
	forget(key uint64, p *params, clock *memoryClock) bool
	sweep(p *params, clock *memoryClock) int
	setMaxKeys(n int)
	len() int
}

// NewMemory returns an empty memory store enforcing p.
func NewMemory(p Policy, opts MemoryOptions) (*Memory, error) {
	params, err := p.compile()
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	m := &Memory{policy: p, maxCost: p.MaxCost(), p: params, clock: memoryClock{opts.Clock}, seed: maphash.MakeSeed()}
	m.tables = params.alg.newTables()
	m.SetMaxKeys(opts.MaxKeys)
	return m, nil
}

// Sharing returns a store over m's keys that decides by p instead: for
// concurrency only, whose state is the requests in flight whatever limit
// counts them. A zone's concurrency limits (its own, its tiers', its
// overrides', a reload's new one) are views of one store, so a key whose
// limit changes while requests run still counts them, and each view gives
// slots back into the same count (docs/design.md, "Exact where features
// meet").
func (m *Memory) Sharing(p Policy) (*Memory, error) {
	params, err := p.compile()
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	if !params.alg.ReleasesOnFinish || !m.p.alg.ReleasesOnFinish {
		return nil, fmt.Errorf("memory store: only concurrency limits share their state, not %s and %s", m.policy.Algorithm, p.Algorithm)
	}
	return &Memory{policy: p, maxCost: p.MaxCost(), p: params, clock: m.clock, seed: m.seed, tables: m.tables}, nil
}

// Policy is the limit this store enforces.
func (m *Memory) Policy() Policy { return m.policy }

// SetMaxKeys changes the bound on keys; a smaller bound takes effect as new
// keys arrive. Zero means DefaultMaxKeys. The bound is shared among the
// shards, whose number follows it (see minShardKeys); a change that alters
// the shard count moves every key while holding every lock, applying a
// smaller bound at once: a reload-time operation, not one for the request
// path.
func (m *Memory) SetMaxKeys(n int) {
	if n <= 0 {
		n = DefaultMaxKeys
	}
	m.tables.setMaxKeys(n)
}

// memoryClock is a memory store's time source. The store reads it with the
// key's shard locked, so the decisions of a shard see time in the order they
// are made: read before the lock, a request that read the clock just before
// a window boundary could reach the state after one that read it just after,
// or after a Sweep that had already forgotten the key, and be counted in a
// window that was already full.
type memoryClock struct{ c Clock }

// now is the store's time in µs. Without an injected clock it is the wall
// clock at process start advanced by the monotonic clock: time.Now reads
// two clocks and costs about a third of a decision, time.Since one. Only
// this process's decisions read it, so it need not follow steps of the
// wall clock, and not following them keeps windows and buckets from
// jumping when the wall clock is set.
func (mc *memoryClock) now() int64 {
	if mc.c == nil {
		return processStartUs + time.Since(processStart).Microseconds()
	}
	return mc.c.Now().UnixMicro()
}

// Take implements Store; it fails only for a cost below 1, which the
// other stores refuse too (a negative one would credit the key's state).
func (m *Memory) Take(_ context.Context, key string, cost int64) (Admission, error) {
	if cost < 1 {
		return Admission{}, fmt.Errorf("memory store: cost %d below 1", cost)
	}
	t, at, mark, epoch := m.tables.take(maphash.String(m.seed, key), &m.p, &m.clock, cost, cost)
	return m.admission(key, t, at, mark, epoch), nil
}

// admission is the Admission of what the algorithm took (see taken),
// decided at at, logged at mark, from the state epoch names: it holds the
// units taken of key in m. Receipt.Granted is set for the algorithms
// that lease or charge, which alone read it. The Decisions are written
// out rather than built by a helper: one call more puts admission over
// the inliner's budget, and a function that is not inlined returns the
// Admission through one more copy.
func (m *Memory) admission(key string, t taken, at, mark int64, epoch uint64) Admission {
	if t.units < 0 {
		return Admission{Decision: Decision{Remaining: t.remaining, ResetAfter: t.reset, RetryAfter: t.wait, Time: at}, Receipt: Receipt{At: at}}
	}
	var granted int64
	if m.p.alg.Leases {
		granted = t.units
	}
	return Admission{
		Decision: Decision{Allowed: true, Remaining: t.remaining, ResetAfter: t.reset, RetryAfter: t.wait, Time: at},
		Receipt:  Receipt{At: at, Mark: mark, Epoch: epoch, Granted: granted},
		store:    m, key: key, held: t.units,
	}
}

// TakeUpTo implements Leaser for the algorithms whose Traits say Leases;
// for the others it fails.
func (m *Memory) TakeUpTo(_ context.Context, key string, cost, want int64) (Admission, error) {
	if cost < 1 || want < cost {
		return Admission{}, fmt.Errorf("memory store: lease of %d wanted for a cost of %d", want, cost)
	}
	if !m.p.alg.Leases {
		return Admission{}, fmt.Errorf("memory store: %s does not lease", m.policy.Algorithm)
	}
	t, at, mark, epoch := m.tables.take(maphash.String(m.seed, key), &m.p, &m.clock, cost, want)
	return m.admission(key, t, at, mark, epoch), nil
}

// Charge implements Charger for the algorithms whose Traits say Charges;
// for the others, and for a cost outside 1..MaxCost, it fails.
func (m *Memory) Charge(_ context.Context, key string, cost int64) (Admission, error) {
	if most := m.maxCost; cost < 1 || cost > most {
		return Admission{}, fmt.Errorf("memory store: charge of %d outside 1..%d", cost, most)
	}
	if !m.p.alg.Charges {
		return Admission{}, fmt.Errorf("memory store: %s cannot charge past its limit", m.policy.Algorithm)
	}
	t, at, mark, epoch := m.tables.charge(maphash.String(m.seed, key), &m.p, &m.clock, cost)
	return Admission{
		Decision: Decision{Allowed: true, Remaining: t.remaining, ResetAfter: t.reset, RetryAfter: t.wait, Time: at},
		Receipt:  Receipt{At: at, Mark: mark, Epoch: epoch, Granted: t.units},
	}, nil
}

// Renew implements Leaser: the return, then the lease. Each is atomic on
// its own; a memory store is not shared between instances, so nothing else
// needs the two together.
func (m *Memory) Renew(ctx context.Context, back Return, cost, want int64) (Admission, error) {
	if _, err := m.GiveBack(ctx, back.Key, back.Units, back.Taken); err != nil {
		return Admission{}, err
	}
	return m.TakeUpTo(ctx, back.Key, cost, want)
}

// LeaseLane implements LeaseBatcher: a memory store is one lane.
func (m *Memory) LeaseLane(string) int { return 0 }

// LeaseMany implements LeaseBatcher: each ask in turn, as TakeUpTo or
// Renew.
func (m *Memory) LeaseMany(ctx context.Context, asks []LeaseAsk) []LeaseAnswer {
	answers := make([]LeaseAnswer, len(asks))
	for i, a := range asks {
		if a.Back.Units > 0 {
			answers[i].Admission, answers[i].Err = m.Renew(ctx, a.Back, a.Cost, a.Want)
		} else {
			answers[i].Admission, answers[i].Err = m.TakeUpTo(ctx, a.Key, a.Cost, a.Want)
		}
	}
	return answers
}

// ReturnMany implements Leaser; it never fails.
func (m *Memory) ReturnMany(ctx context.Context, returns []Return) error {
	for _, r := range returns {
		_, _ = m.GiveBack(ctx, r.Key, r.Units, r.Taken)
	}
	return nil
}

// Peek implements Store; it never fails, and a key it does not hold is
// reported as fresh without being added.
func (m *Memory) Peek(_ context.Context, key string) (Decision, error) {
	return m.tables.refund(maphash.String(m.seed, key), &m.p, &m.clock, 0, 0, 0), nil
}

// Reset implements Store; it never fails. A key held whose state is back
// to empty (not yet swept) did not exist, as Redis would have let it expire.
func (m *Memory) Reset(_ context.Context, key string) (bool, error) {
	return m.tables.forget(maphash.String(m.seed, key), &m.p, &m.clock), nil
}

// GiveBack implements Store; it never fails. A key forgotten since the
// Take (reset, swept or evicted) has nothing to give back: its state now,
// if it has come back since, is another (Receipt.Epoch), and the units
// are dropped.
func (m *Memory) GiveBack(_ context.Context, key string, units int64, taken Receipt) (Decision, error) {
	return m.tables.refund(maphash.String(m.seed, key), &m.p, &m.clock, units, taken.Name(), taken.Epoch), nil
}

// Sweep forgets every key whose state is back to empty and reports how many
// it forgot. It locks one shard at a time.
func (m *Memory) Sweep() int {
	return m.tables.sweep(&m.p, &m.clock)
}

// Len is how many keys the store holds.
func (m *Memory) Len() int { return m.tables.len() }

// keyState is the per-key state of one algorithm, as a pointer method set.
type keyState[S any] interface {
	*S
	// take takes cost units when they fit; an algorithm that leases
	// (Traits.Leases) takes more while they fit, up to want. It answers
	// what it took and reports (taken), the time it decided at (now, or
	// the stored window's start when now is behind it) and, for a
	// sliding log, the time it logged the units at (mark; 0 for the
	// others). It tells e whether the state held nothing at now, as idle
	// would say (epochs.judge).
	take(p *params, now, cost, want int64, e epochs) (t taken, at, mark int64)
	// charge takes cost units whether or not they fit, for an algorithm
	// whose state can owe (Traits.Charges); Memory.Charge asks no other.
	// It answers as take does, units being what it charged.
	charge(p *params, now, cost int64, e epochs) (t taken, at, mark int64)
	// refund gives cost units back of the admission named name
	// (Receipt.Name).
	refund(p *params, now, cost, name int64) Decision
	idle(p *params, now int64) bool
}

// shardSet spreads keys over 1<<bits tables by the top bits of their hash.
type shardSet[S any, PS keyState[S]] struct {
	shards [memoryShards]shard[S, PS]
	// bits changes only in reshard, which holds every shard's lock, so a
	// goroutine holding a shard's lock sees it stable.
	bits atomic.Uint32
	// resize serializes setMaxKeys.
	resize sync.Mutex
}

func newShardSet[S any, PS keyState[S]]() *shardSet[S, PS] {
	set := &shardSet[S, PS]{}
	for i := range set.shards {
		set.shards[i].index = make(map[uint64]uint32)
	}
	return set
}

// lock locks and returns the shard of key. It checks the shard count again
// under the lock, since a reshard may have moved the key meanwhile.
func (set *shardSet[S, PS]) lock(key uint64) *shard[S, PS] {
	for {
		bits := set.bits.Load()
		sh := &set.shards[key>>(64-bits)] // a shift by 64 gives shard 0
		sh.mu.Lock()
		if set.bits.Load() == bits {
			return sh
		}
		sh.mu.Unlock()
	}
}

// take and charge read the clock inside the shard's lock, so the
// decisions of one key are in the order of their times; the key's cell is
// created if need be (see get). They answer as the algorithm does, with
// the epoch of the state it took from (epochs.judge).
func (set *shardSet[S, PS]) take(key uint64, p *params, clock *memoryClock, cost, want int64) (t taken, at, mark int64, epoch uint64) {
	sh := set.lock(key)
	c := &sh.cells[sh.get(key)]
	t, at, mark = PS(&c.st).take(p, clock.now(), cost, want, epochs{&c.epoch, &sh.epochs})
	epoch = c.epoch
	sh.mu.Unlock()
	return t, at, mark, epoch
}

func (set *shardSet[S, PS]) charge(key uint64, p *params, clock *memoryClock, cost int64) (t taken, at, mark int64, epoch uint64) {
	sh := set.lock(key)
	c := &sh.cells[sh.get(key)]
	t, at, mark = PS(&c.st).charge(p, clock.now(), cost, epochs{&c.epoch, &sh.epochs})
	epoch = c.epoch
	sh.mu.Unlock()
	return t, at, mark, epoch
}

// refund gives cost units back to key's state when epoch names it (or is
// zero, naming none): a give-back to a state that has ended since (reset,
// swept, evicted) gives nothing, and reports the key's state as it is.
func (set *shardSet[S, PS]) refund(key uint64, p *params, clock *memoryClock, cost, name int64, epoch uint64) Decision {
	sh := set.lock(key)
	var now int64
	if !p.alg.timeless {
		now = clock.now()
	}
	var d Decision
	if i, ok := sh.index[key]; ok {
		c := &sh.cells[i]
		if epoch != 0 && epoch != c.epoch {
			cost = 0
		}
		d = PS(&c.st).refund(p, now, cost, name)
	} else {
		var fresh S // a key not held reports as fresh, and is not added
		d = PS(&fresh).refund(p, now, 0, name)
	}
	sh.mu.Unlock()
	return d
}

func (set *shardSet[S, PS]) forget(key uint64, p *params, clock *memoryClock) bool {
	sh := set.lock(key)
	defer sh.mu.Unlock()
	i, ok := sh.index[key]
	if !ok {
		return false
	}
	existed := !PS(&sh.cells[i].st).idle(p, clock.now())
	sh.remove(key, i)
	return existed
}

func (set *shardSet[S, PS]) sweep(p *params, clock *memoryClock) int {
	n := 0
	for i := range set.shards {
		sh := &set.shards[i]
		sh.mu.Lock()
		now := clock.now()
		for key, j := range sh.index {
			if PS(&sh.cells[j].st).idle(p, now) {
				sh.remove(key, j)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// setMaxKeys bounds the set to n keys over shardBitsFor(n) shards. Changing
// the shard count moves every key (reshard).
func (set *shardSet[S, PS]) setMaxKeys(n int) {
	set.resize.Lock()
	defer set.resize.Unlock()
	bits := shardBitsFor(n)
	if bits != set.bits.Load() {
		set.reshard(bits, n)
		return
	}
	set.setLimits(bits, n)
}

// setLimits shares n keys among the 1<<bits shards in use: n>>bits each and
// one more for the first n mod 1<<bits, so together they hold exactly n.
func (set *shardSet[S, PS]) setLimits(bits uint32, n int) {
	per, extra := int64(n>>bits), n&(1<<bits-1)
	for i := range set.shards {
		limit := per
		if i < extra {
			limit++
		}
		set.shards[i].limit.Store(limit)
	}
}

// reshard moves every key to the shard it belongs to among 1<<bits, sharing
// n keys among them, keeping each shard's order of use. When shards
// merge, the order of use between keys of different old shards is not
// known, so evictions the smaller bound forces are only roughly LRU.
func (set *shardSet[S, PS]) reshard(bits uint32, n int) {
	for i := range set.shards {
		set.shards[i].mu.Lock()
	}
	type entry struct {
		key   uint64
		epoch uint64
		st    S
	}
	var all []entry
	// Every shard goes on numbering epochs from the highest any had
	// reached, so no key's new state can take an epoch one of its
	// states had in the shard it moved from.
	var epochs uint64
	for i := range set.shards {
		sh := &set.shards[i]
		epochs = max(epochs, sh.epochs)
		// Oldest first: prev links lead to more recently used cells.
		for j := sh.oldest; j != 0; j = sh.cells[j-1].prev {
			all = append(all, entry{sh.cells[j-1].key, sh.cells[j-1].epoch, sh.cells[j-1].st})
		}
		sh.index = make(map[uint64]uint32)
		sh.cells = nil
		sh.newest, sh.oldest, sh.free = 0, 0, 0
	}
	set.setLimits(bits, n)
	set.bits.Store(bits)
	for i := range set.shards {
		set.shards[i].epochs = epochs
	}
	for _, e := range all {
		sh := &set.shards[e.key>>(64-bits)]
		c := &sh.cells[sh.get(e.key)]
		c.st, c.epoch = e.st, e.epoch
	}
	for i := range set.shards {
		set.shards[i].mu.Unlock()
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

// shard is one locked table: a map from key hash to a cell, the cells in a
// slice (no per-key allocation, nothing for the garbage collector to
// trace for fixed-size states), and a doubly linked list through the cells
// in order of use for eviction. Links are cell index + 1; 0 ends a list.
type shard[S any, PS keyState[S]] struct {
	mu    sync.Mutex
	index map[uint64]uint32
	cells []cell[S]
	// newest and oldest are the ends of the use list; free heads the list
	// of unused cells, linked through next.
	newest, oldest, free uint32
	// moves counts pushes to the front of the use list (see touch).
	moves uint64
	// epochs counts the states the shard has made: the last one's
	// epoch (cell.epoch).
	epochs uint64
	limit  atomic.Int64
	// Pad the shard to 128 bytes, two whole cache lines, so no two shards'
	// locks and hot fields share a line (TestShardSize keeps it so).
	_ [48]byte
}

type cell[S any] struct {
	key        uint64
	prev, next uint32
	// moved is the shard's moves when this cell last went to the front:
	// 8 bytes a key (a uint32 would be padded to the same), bought for the
	// relinks touch skips. 64 bits so it cannot wrap.
	moved uint64
	// epoch names the key's state among every state the store has made
	// for it (Receipt.Epoch): a reset, sweep or eviction frees the cell,
	// and the key's next take makes a state with a new epoch (as does a
	// take that finds the state empty, see epochs.judge), which the
	// give-backs of the units an earlier state counted do not reach.
	// Numbered per shard (and never below another shard's, see reshard),
	// so it costs no shared counter; 64 bits so it cannot wrap.
	epoch uint64
	st    S
}

// get returns the cell of key, creating it (and evicting the least recently
// used key when the shard is full) if need be, and marks it most recently used.
func (sh *shard[S, PS]) get(key uint64) uint32 {
	if i, ok := sh.index[key]; ok {
		sh.touch(i)
		return i
	}
	// A loop, not an if: after SetMaxKeys lowered the bound, the shard
	// sheds the excess as new keys arrive.
	for int64(len(sh.index)) >= sh.limit.Load() && sh.oldest != 0 {
		sh.remove(sh.cells[sh.oldest-1].key, sh.oldest-1)
	}
	// A new cell is a new state, with an epoch of its own whether or not
	// the algorithm's take then judges it empty (a calendar window on a
	// clock before 1970 sees its zero window as ahead, and would name
	// it 0, no state).
	sh.epochs++
	fresh := cell[S]{key: key, epoch: sh.epochs}
	var i uint32
	if sh.free != 0 {
		i = sh.free - 1
		sh.free = sh.cells[i].next
		sh.cells[i] = fresh
	} else {
		i = uint32(len(sh.cells))
		sh.cells = append(sh.cells, fresh)
	}
	sh.index[key] = i
	sh.pushNewest(i)
	return i
}

// touch marks cell i most recently used. A cell that went to the front
// within the last limit/16 moves is left where it is: at most that many
// cells lie before it, so it is far from eviction, and not relinking it
// spares the writes to its neighbours (two cache misses) on most
// decisions of an active key. Eviction is thus LRU to within limit/16 keys,
// and exact for shards of fewer than 16 keys.
func (sh *shard[S, PS]) touch(i uint32) {
	if sh.newest == i+1 || sh.moves-sh.cells[i].moved < uint64(sh.limit.Load()>>4) {
		return
	}
	sh.unlink(i)
	sh.pushNewest(i)
}

func (sh *shard[S, PS]) pushNewest(i uint32) {
	sh.moves++
	s := &sh.cells[i]
	s.prev, s.next, s.moved = 0, sh.newest, sh.moves
	if sh.newest != 0 {
		sh.cells[sh.newest-1].prev = i + 1
	}
	sh.newest = i + 1
	if sh.oldest == 0 {
		sh.oldest = i + 1
	}
}

func (sh *shard[S, PS]) unlink(i uint32) {
	s := &sh.cells[i]
	if s.prev != 0 {
		sh.cells[s.prev-1].next = s.next
	} else {
		sh.newest = s.next
	}
	if s.next != 0 {
		sh.cells[s.next-1].prev = s.prev
	} else {
		sh.oldest = s.prev
	}
}

// remove forgets key, whose cell is i, and puts the cell on the free list.
func (sh *shard[S, PS]) remove(key uint64, i uint32) {
	delete(sh.index, key)
	sh.unlink(i)
	sh.cells[i] = cell[S]{next: sh.free}
	sh.free = i + 1
}

var (
	_ LeaseBatcher = (*Memory)(nil)
	_ Charger      = (*Memory)(nil)
)

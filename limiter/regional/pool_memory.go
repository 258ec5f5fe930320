package regional

import (
	"context"
	"sync"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// MemoryPool is a Pool in this process: the regional Redis's pool as
// lua/pool_spend.lua and lua/pool_fill.lua keep it, step for step, for
// tests that stand several regions on one clock. It forgets nothing but
// on Reset, so it is not for production use.
type MemoryPool struct {
	mu    sync.Mutex
	keys  map[string]*poolKey
	clock limiter.Clock
}

// poolKey is one key's pool.
type poolKey struct {
	batch  Batch
	denial Denial
	// lock is the token of the instance refilling the key, which holds
	// until lockUntil (µs).
	lock      string
	lockUntil int64
	// size is the next batch's size before the request's own want (see
	// Spend).
	size int64
}

// NewMemoryPool returns an empty pool reading clock (nil: the system
// clock).
func NewMemoryPool(clock limiter.Clock) *MemoryPool {
	if clock == nil {
		clock = limiter.SystemClock
	}
	return &MemoryPool{keys: make(map[string]*poolKey), clock: clock}
}

func (m *MemoryPool) key(key string) *poolKey {
	k := m.keys[key]
	if k == nil {
		k = &poolKey{}
		m.keys[key] = k
	}
	return k
}

// Spend implements Pool, as lua/pool_spend.lua does.
func (m *MemoryPool) Spend(_ context.Context, key string, s PoolSpend) (Spent, error) {
	now := m.clock.Now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	b := &k.batch
	if s.Pay {
		var paid int64
		if now < b.Expires {
			paid = min(b.Units, s.Cost)
			b.Units -= paid
		}
		out := SpendNone
		if paid > 0 {
			out = SpendTaken
		}
		return Spent{Outcome: out, Units: paid, Now: now, Batch: *b}, nil
	}
	if now < k.denial.Until {
		return Spent{Outcome: SpendDenied, Now: now, Batch: *b, Denial: k.denial}, nil
	}
	if now < b.Expires && b.Units >= s.Cost {
		g := min(s.Want, b.Units)
		b.Units -= g
		return Spent{Outcome: SpendTaken, Units: g, Now: now, Batch: *b}, nil
	}
	if k.lock != "" && now < k.lockUntil {
		return Spent{Outcome: SpendWait, Now: now, Batch: *b, Wait: k.lockUntil - now}, nil
	}
	// The refill is the caller's. A lapsed batch's units go back to
	// global with it; a short one's stay for smaller requests until the
	// next batch replaces it.
	var back int64
	if now >= b.Expires {
		back, b.Units = b.Units, 0
	}
	switch {
	case b.Sent == 0 || now-b.Sent >= 2*s.Life:
		k.size = s.Want
	case now < b.Expires:
		// Spent before it lapsed: the next one is twice as large.
		k.size = min(2*k.size, s.MaxBatch)
	}
	want := max(s.Cost, min(max(k.size, s.Want), s.MaxBatch))
	k.lock, k.lockUntil = s.Token, now+s.LockFor
	return Spent{Outcome: SpendRefill, Units: back, Now: now, Batch: *b, Want: want}, nil
}

// Fill implements Pool, as lua/pool_fill.lua does.
func (m *MemoryPool) Fill(_ context.Context, key, token string, f PoolFill) (Filled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	if k.lock != token {
		return Filled{}, nil
	}
	out := Filled{Ours: true, Old: k.batch.Units, OldMark: k.batch.Mark, OldEpoch: k.batch.Epoch}
	k.batch = f.Batch
	k.denial = Denial{}
	if f.Denied {
		k.denial = f.Denial
	}
	k.lock, k.lockUntil = "", 0
	return out, nil
}

// Unlock implements Pool.
func (m *MemoryPool) Unlock(_ context.Context, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k := m.keys[key]; k != nil && k.lock == token {
		k.lock, k.lockUntil = "", 0
	}
	return nil
}

// Back implements Pool.
func (m *MemoryPool) Back(_ context.Context, key string, units, mark int64, epoch uint64) (bool, error) {
	now := m.clock.Now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.keys[key]
	if k == nil || units <= 0 || k.batch.Mark != mark || epoch != 0 && k.batch.Epoch != epoch || now >= k.batch.Expires || !k.batch.TakesBack {
		return false, nil
	}
	k.batch.Units += units
	return true, nil
}

// Drain implements Pool, as lua/pool_fill.lua does.
func (m *MemoryPool) Drain(_ context.Context, key string, mark int64, force bool) (Drained, error) {
	now := m.clock.Now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.keys[key]
	switch {
	case k == nil || k.batch.Mark != mark:
		return Drained{Outcome: DrainGone}, nil
	case !force && now < k.batch.Expires:
		return Drained{Outcome: DrainLater}, nil
	}
	b := &k.batch
	n := b.Units
	b.Units, b.TakesBack, b.Expires = 0, false, min(b.Expires, now)
	if n == 0 {
		return Drained{Outcome: DrainGone}, nil
	}
	return Drained{Outcome: DrainTaken, Units: n}, nil
}

// Peek implements Pool.
func (m *MemoryPool) Peek(_ context.Context, key string) (Spent, error) {
	now := m.clock.Now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := Spent{Now: now}
	if k := m.keys[key]; k != nil {
		out.Batch, out.Denial = k.batch, k.denial
	}
	return out, nil
}

// Reset implements Pool.
func (m *MemoryPool) Reset(_ context.Context, key string) (bool, error) {
	now := m.clock.Now().UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.keys[key]
	if k == nil {
		return false, nil
	}
	delete(m.keys, key)
	return (k.batch.Units > 0 && now < k.batch.Expires) || now < k.denial.Until || k.lock != "", nil
}

var _ Pool = (*MemoryPool)(nil)

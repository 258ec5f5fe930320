package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// Pool is a region's pool of units taken from global (regional.Pool), in
// the regional Redis: one hash per key beside the key's state, named like
// it with ":pool" added (so on a Cluster or shards it lives where the
// key's state does), read and written by lua/pool_spend.lua and
// lua/pool_fill.lua, one script call per step. Calls share the store's
// breaker, timeout and clock (Redis TIME, or the instance's where the
// server refuses it).
type Pool struct {
	store       *Store
	spend, fill *redis.Script
}

var (
	poolSpendScript = redis.NewScript(lua.PoolSpend())
	poolFillScript  = redis.NewScript(lua.PoolFill())
)

// NewPool returns the pool of the limit p (named by opts as for New) in
// the Redis client reaches.
func NewPool(client redis.UniversalClient, p limiter.Policy, opts Options) (*Pool, error) {
	s, err := New(client, p, opts)
	if err != nil {
		return nil, fmt.Errorf("regional pool: %w", err)
	}
	return &Pool{store: s, spend: poolSpendScript, fill: poolFillScript}, nil
}

// Key is the Redis key of a client key's pool.
func (p *Pool) Key(key string) string { return p.store.Key(key) + ":pool" }

// Up reports whether calls go to Redis now (see Store.Up).
func (p *Pool) Up() bool { return p.store.Up() }

// Preload connects to the pool's Redis and loads the pool's scripts
// there, as Store.Preload does the store's, so a region's first spend is
// an ordinary one.
func (p *Pool) Preload(ctx context.Context) error {
	r := p.store
	probeErr := r.serverClock.probeStale(ctx)
	if err := r.loadScripts(ctx, p.spend, p.fill); err != nil {
		return fmt.Errorf("regional pool: %w", err)
	}
	if probeErr != nil {
		return fmt.Errorf("regional pool for zone %q: %w", r.zone, probeErr)
	}
	return nil
}

// InstanceClock reports whether the pool's Redis refuses TIME in scripts
// (see Store.InstanceClock).
func (p *Pool) InstanceClock() bool { return p.store.InstanceClock() }

// run calls script on key's pool with first (the prelude's cost
// argument) and rest after the prelude's four, under the store's timeout
// and breaker.
func (p *Pool) run(ctx context.Context, script *redis.Script, key string, first any, rest ...any) ([]int64, error) {
	r := p.store
	redisKey := p.Key(key)
	b, _ := r.routeOf(redisKey)
	if b.open() {
		return nil, ErrUnavailable
	}
	ctx = r.deadlines.bound(ctx, r.timeout)
	var now any = ""
	switch {
	case r.clock != nil:
		now = r.clock.Now().UnixMicro()
	case r.serverClock.Instance():
		now = r.serverClock.instanceNow()
	}
	args := append([]any{first, now, 0, 0}, rest...)
	reply, err := script.Run(ctx, r.client, []string{redisKey}, args...).Int64Slice()
	if err = r.outcome(b, err); err != nil {
		return nil, fmt.Errorf("regional pool for zone %q: %w", r.zone, err)
	}
	return reply, nil
}

// Spend implements regional.Pool.
func (p *Pool) Spend(ctx context.Context, key string, s regional.PoolSpend) (regional.Spent, error) {
	mode := "take"
	if s.Pay {
		mode = "pay"
	}
	reply, err := p.run(ctx, p.spend, key, s.Cost, mode, s.Want, s.Token, s.LockFor, s.MaxBatch, s.Life)
	if err != nil {
		return regional.Spent{}, err
	}
	return decodeSpent(reply)
}

// Peek implements regional.Pool.
func (p *Pool) Peek(ctx context.Context, key string) (regional.Spent, error) {
	reply, err := p.run(ctx, p.spend, key, 0, "peek")
	if err != nil {
		return regional.Spent{}, err
	}
	return decodeSpent(reply)
}

// decodeSpent reads pool_spend.lua's reply.
func decodeSpent(r []int64) (regional.Spent, error) {
	if len(r) != 20 {
		return regional.Spent{}, fmt.Errorf("pool script replied with %d values, want 20", len(r))
	}
	return regional.Spent{
		Outcome: int(r[0]), Units: r[1], Now: r[2],
		Batch: regional.Batch{Units: r[3], Expires: r[4], Sent: r[5], Mark: r[6], Time: r[7], Remaining: r[8], Reset: r[9], TakesBack: r[10] == 1, Epoch: uint64(r[19])},
		Want:  r[11], Wait: r[12],
		Denial: regional.Denial{Until: r[13], Made: r[14], Remaining: r[15], Retry: r[16], Reset: r[17], Time: r[18]},
	}, nil
}

// Fill implements regional.Pool.
func (p *Pool) Fill(ctx context.Context, key, token string, f regional.PoolFill) (regional.Filled, error) {
	b, d := f.Batch, f.Denial
	denied := 0
	if f.Denied {
		denied = 1
	}
	takesBack := 0
	if b.TakesBack {
		takesBack = 1
	}
	reply, err := p.run(ctx, p.fill, key, 0, "fill", token, regional.Lifetime.Microseconds(),
		b.Units, b.Expires, b.Sent, b.Mark, b.Time, b.Remaining, b.Reset, takesBack,
		denied, d.Until, d.Made, d.Remaining, d.Retry, d.Reset, d.Time, int64(b.Epoch))
	if err != nil {
		return regional.Filled{}, err
	}
	if len(reply) != 4 {
		return regional.Filled{}, fmt.Errorf("pool script replied with %d values, want 4", len(reply))
	}
	return regional.Filled{Ours: reply[0] == 1, Old: reply[1], OldMark: reply[2], OldEpoch: uint64(reply[3])}, nil
}

// Unlock implements regional.Pool.
func (p *Pool) Unlock(ctx context.Context, key, token string) error {
	_, err := p.run(ctx, p.fill, key, 0, "unlock", token)
	return err
}

// Back implements regional.Pool.
func (p *Pool) Back(ctx context.Context, key string, units, mark int64, epoch uint64) (bool, error) {
	reply, err := p.run(ctx, p.fill, key, units, "back", mark, int64(epoch))
	if err != nil {
		return false, err
	}
	return len(reply) == 1 && reply[0] == 1, nil
}

// Drain implements regional.Pool.
func (p *Pool) Drain(ctx context.Context, key string, mark int64, force bool) (regional.Drained, error) {
	forced := 0
	if force {
		forced = 1
	}
	reply, err := p.run(ctx, p.fill, key, 0, "drain", mark, forced)
	if err != nil {
		return regional.Drained{}, err
	}
	if len(reply) != 2 {
		return regional.Drained{}, fmt.Errorf("pool script replied with %d values, want 2", len(reply))
	}
	return regional.Drained{Outcome: int(reply[0]), Units: reply[1]}, nil
}

// Reset implements regional.Pool: it deletes the key's pool.
func (p *Pool) Reset(ctx context.Context, key string) (bool, error) {
	r := p.store
	ctx = r.deadlines.bound(ctx, r.timeout)
	n, err := r.client.Del(ctx, p.Key(key)).Result()
	if err != nil {
		return false, fmt.Errorf("regional pool for zone %q: reset: %w", r.zone, err)
	}
	return n > 0, nil
}

var _ regional.Pool = (*Pool)(nil)

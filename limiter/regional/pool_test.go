package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
)

// TestPoolDrainEndsTheBatch: on both pools, the MemoryPool and the
// regional Redis's scripts (lua/pool_fill.lua), a drain ends the batch it
// names. An empty batch that still lives is left to lapse (DrainLater:
// its installer keeps tracking it, for units given back meanwhile); once
// drained, when lapsed or forced at once (Close), the batch takes no
// give-back, which would otherwise stay in the pool with no janitor to
// return it to global.
func TestPoolDrainEndsTheBatch(t *testing.T) {
	eachPool(t, "drain", func(t *testing.T, pool regional.Pool) {
		ctx := context.Background()
		// install puts a batch of units into key's pool, live for a
		// lifetime, as a refill does, and returns its mark.
		install := func(key string, units int64) int64 {
			t.Helper()
			sp, err := pool.Spend(ctx, key, regional.PoolSpend{Cost: 1, Want: 1, Token: "t", LockFor: time.Second.Microseconds(),
				MaxBatch: 10, Life: regional.Lifetime.Microseconds()})
			if err != nil || sp.Outcome != regional.SpendRefill {
				t.Fatalf("claiming the refill of %s: %+v, %v", key, sp, err)
			}
			b := regional.Batch{Units: units, Sent: sp.Now, Expires: sp.Now + regional.Lifetime.Microseconds(), Mark: sp.Now, TakesBack: true}
			if rep, err := pool.Fill(ctx, key, "t", regional.PoolFill{Batch: b}); err != nil || !rep.Ours {
				t.Fatalf("filling %s: %+v, %v", key, rep, err)
			}
			return b.Mark
		}
		drain := func(key string, mark int64, force bool, want regional.Drained) {
			t.Helper()
			if got, err := pool.Drain(ctx, key, mark, force); err != nil || got != want {
				t.Fatalf("drain of %s (force %v): %+v, %v; want %+v", key, force, got, err, want)
			}
		}
		back := func(key string, mark int64, want bool) {
			t.Helper()
			if got, err := pool.Back(ctx, key, 2, mark, 0); err != nil || got != want {
				t.Fatalf("give-back into %s: %v, %v; want %v", key, got, err, want)
			}
		}

		m := install("empty", 0)
		drain("empty", m, false, regional.Drained{Outcome: regional.DrainLater})
		back("empty", m, true) // it lives: the give-back goes into it
		drain("empty", m, true, regional.Drained{Outcome: regional.DrainTaken, Units: 2})
		back("empty", m, false)

		m = install("forced", 3)
		drain("forced", m, true, regional.Drained{Outcome: regional.DrainTaken, Units: 3})
		back("forced", m, false)
		drain("forced", m, true, regional.Drained{Outcome: regional.DrainGone})

		m = install("forced-empty", 0)
		drain("forced-empty", m, true, regional.Drained{Outcome: regional.DrainGone})
		back("forced-empty", m, false)
		if ps, err := pool.Peek(ctx, "forced-empty"); err != nil || ps.Now < ps.Batch.Expires {
			t.Fatalf("a drained batch still lives: %+v, %v", ps, err)
		}
	})
}

// TestPoolBackNamesTheEpoch: on both pools, a give-back goes into the
// batch only if it names the batch's mark and global's state that granted
// it (Batch.Epoch; 0 names any), and a fill reports the epoch of the batch
// it replaced: a batch granted after an admin reset under the same mark
// (a grant in the same µs) takes no unit of one granted before it.
func TestPoolBackNamesTheEpoch(t *testing.T) {
	eachPool(t, "epoch", func(t *testing.T, pool regional.Pool) {
		ctx := context.Background()
		// fill claims the refill with a request of cost (more than
		// the batch holds) and installs a batch of 3 units of epoch.
		fill := func(epoch uint64, cost int64) regional.Filled {
			t.Helper()
			sp, err := pool.Spend(ctx, "k", regional.PoolSpend{Cost: cost, Want: cost, Token: "t", LockFor: time.Second.Microseconds(),
				MaxBatch: 10, Life: regional.Lifetime.Microseconds()})
			if err != nil || sp.Outcome != regional.SpendRefill {
				t.Fatalf("claiming the refill: %+v, %v", sp, err)
			}
			b := regional.Batch{Units: 3, Sent: sp.Now, Expires: sp.Now + regional.Lifetime.Microseconds(), Mark: 42, Epoch: epoch, TakesBack: true}
			rep, err := pool.Fill(ctx, "k", "t", regional.PoolFill{Batch: b})
			if err != nil || !rep.Ours {
				t.Fatalf("filling: %+v, %v", rep, err)
			}
			return rep
		}
		fill(7, 1)
		if sp, err := pool.Peek(ctx, "k"); err != nil || sp.Batch.Epoch != 7 {
			t.Fatalf("peek: %+v, %v; want the batch of epoch 7", sp.Batch, err)
		}
		for _, tc := range []struct {
			epoch uint64
			want  bool
		}{{8, false}, {7, true}, {0, true}} {
			if got, err := pool.Back(ctx, "k", 1, 42, tc.epoch); err != nil || got != tc.want {
				t.Errorf("give-back naming epoch %d into the batch of epoch 7: %v, %v; want %v", tc.epoch, got, err, tc.want)
			}
		}
		// A request of more than the batch holds refills it: the
		// fill reports what the batch it replaced held.
		if _, err := pool.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		fill(7, 1)
		if rep := fill(9, 4); rep.Old != 3 || rep.OldMark != 42 || rep.OldEpoch != 7 {
			t.Errorf("the fill that replaced the batch of epoch 7 reports %+v, want its 3 units, mark 42 and epoch 7", rep)
		}
	})
}

// TestRegionsGiveBackAfterCloseOverRedis is TestGiveBackAfterItsBatchWasDrained
// over a regional and a global redis-server: a unit given back after the
// batch's installer closed reaches global.
func TestRegionsGiveBackAfterCloseOverRedis(t *testing.T) {
	storetest.AwayFromHourEnd()
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	global, region := redistest.Start(t), redistest.Start(t)
	g, err := redisstore.New(newClient(t, global.Addr()), p, redisstore.Options{Zone: "close", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	instance := func() *regional.Store {
		pool, err := redisstore.NewPool(newClient(t, region.Addr()), p, redisstore.Options{Zone: "close", Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s, err := regional.New(g, pool, p, regional.Options{RegionQuota: 1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := instance(), instance()
	defer func() { _ = b.Close(ctx) }()
	storetest.MustAdmit(t, a, "k")
	storetest.MustAdmit(t, a, "k") // a batch of 2, 1 to spare
	spare := storetest.MustAdmit(t, b, "k")
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := spare.GiveBack(ctx, 1); err != nil {
		t.Fatal(err)
	}
	d, err := g.Peek(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 8 {
		t.Errorf("global has %d left after B's give-back, want 8 (A's two admissions): the unit went into A's drained batch", d.Remaining)
	}
}

// eachPool runs f on both pools of a fixed window of 10 an hour: the
// MemoryPool and the regional Redis's scripts, on a server of its own,
// for zone.
func eachPool(t *testing.T, zone string, f func(t *testing.T, pool regional.Pool)) {
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}
	srv := redistest.Start(t)
	rp, err := redisstore.NewPool(newClient(t, srv.Addr()), p, redisstore.Options{Zone: zone, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		pool regional.Pool
	}{{"memory", regional.NewMemoryPool(nil)}, {"redis", rp}} {
		t.Run(c.name, func(t *testing.T) { f(t, c.pool) })
	}
}

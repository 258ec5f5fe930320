package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisPreload: Preload leaves the store's scripts loaded on every
// server that may run it, the standalone server or each Cluster master,
// before any decision; an unreachable server is an error within ctx.
func TestRedisPreload(t *testing.T) {
	t.Parallel()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}
	loadedOn := func(t *testing.T, r *Store, servers []*redistest.Server) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Preload(ctx); err != nil {
			t.Fatalf("Preload: %v", err)
		}
		for _, s := range servers {
			exists, err := s.Client(t).ScriptExists(ctx, r.script.Hash(), r.batchScript.Hash()).Result()
			if err != nil {
				t.Fatalf("SCRIPT EXISTS on %s: %v", s.Addr(), err)
			}
			if !exists[0] || !exists[1] {
				t.Errorf("the scripts loaded on %s after Preload: %v, want both", s.Addr(), exists)
			}
		}
	}
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		loadedOn(t, newTestRedis(t, s.Client(t), p, Options{Zone: "preload"}), []*redistest.Server{s})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3)
		loadedOn(t, newTestRedis(t, c.Client(t), p, Options{Zone: "preload"}), c.Masters)
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		addr := s.Addr()
		s.Stop()
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { client.Close() })
		r := newTestRedis(t, client, p, Options{Zone: "preload"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Preload(ctx); err == nil {
			t.Fatal("Preload against a stopped server succeeded")
		}
	})
}

// TestPreloadLoadsLiveShardsWhenOneIsDown: with one shard down, Preload
// still loads the scripts on the live shards ("every shard, whatever the
// others do"), so their first decisions pay no NOSCRIPT round trip. It
// guards against Preload returning on the TIME probe's error, which the dead
// shard causes, before loading any.
func TestPreloadLoadsLiveShardsWhenOneIsDown(t *testing.T) {
	live := redistest.Start(t)
	// A port nobody listens on: a shard that is down at startup.
	down := testutil.ClosedAddr(t)
	ring := newShardsClient(t, Config{Shards: []string{live.Addr(), down}})
	r := newTestRedis(t, ring, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Hour},
		Options{Zone: "warm", Timeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.Preload(ctx) // an error is expected: one shard is down
	ok, err := live.Client(t).ScriptExists(context.Background(), r.script.Hash(), r.batchScript.Hash()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !ok[0] || !ok[1] {
		t.Errorf("the live shard's scripts after Preload with another shard down: %v, want both loaded", ok)
	}
}

// TestRedisPoolPreload: a region's pool loads its two scripts before any
// spend.
func TestRedisPoolPreload(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}
	pool, err := NewPool(s.Client(t), p, Options{Zone: "preload"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Preload(ctx); err != nil {
		t.Fatalf("Preload: %v", err)
	}
	exists, err := s.Client(t).ScriptExists(ctx, pool.spend.Hash(), pool.fill.Hash()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !exists[0] || !exists[1] {
		t.Errorf("the pool's scripts loaded after Preload: %v, want both", exists)
	}
}

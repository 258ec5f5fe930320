package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestRedisPreload: Preload leaves the store's scripts loaded on every
// server that may run it, the standalone server or each Cluster master,
// before any decision; an unreachable server is an error within ctx.
func TestRedisPreload(t *testing.T) {
	t.Parallel()
	p := Policy{Algorithm: FixedWindow, Events: 10, Window: time.Minute}
	loadedOn := func(t *testing.T, r *Redis, servers []*redistest.Server) {
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
		loadedOn(t, newTestRedis(t, s.Client(t), p, RedisOptions{Zone: "preload"}), []*redistest.Server{s})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3)
		loadedOn(t, newTestRedis(t, c.Client(t), p, RedisOptions{Zone: "preload"}), c.Masters)
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		addr := s.Addr()
		s.Stop()
		client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { client.Close() })
		r := newTestRedis(t, client, p, RedisOptions{Zone: "preload"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Preload(ctx); err == nil {
			t.Fatal("Preload against a stopped server succeeded")
		}
	})
}

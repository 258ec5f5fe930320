package limiter

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestReviewPreloadLoadsLiveShardsWhenOneIsDown: Preload's comment says
// it loads the scripts on "every shard, whatever the others do", and the
// README that the warm start loads them on every shard. But Preload first
// probes TIME on every shard and returns on the probe's error, so with
// one shard down the live shards never get their scripts: their first
// decisions pay a NOSCRIPT round trip (and with a tight timeout fail
// over).
func TestReviewPreloadLoadsLiveShardsWhenOneIsDown(t *testing.T) {
	live := redistest.Start(t)
	// A port nobody listens on: a shard that is down at startup.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	ring := newShardsClient(t, RedisConfig{Shards: []string{live.Addr(), down}})
	r := newTestRedis(t, ring, Policy{Algorithm: TokenBucket, Events: 10, Window: time.Hour},
		RedisOptions{Zone: "warm", Timeout: time.Second})
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

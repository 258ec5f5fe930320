package e2e

import (
	"net"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestReviewShardsWarmStartWithShardDown: the README says the warm start
// loads every Redis zone's scripts "on every shard" before a config
// serves, and shards exist so that one shard down costs only its own
// keys. With one shard down at startup, the live shard does not get every
// zone's scripts: Preload returns on the TIME probe's error before loading
// any, and warmRedis stops at the first store's error, so the other zones
// are not warmed either. Those zones' first decisions on live shards then
// pay a NOSCRIPT round trip (and with a tight timeout fail over).
//
// The same config with both shards up is the reference: the live shard
// must cache as many scripts as a shard does then.
func TestReviewShardsWarmStartWithShardDown(t *testing.T) {
	t.Parallel()
	routes := []redisRoute{
		{path: "/tb", zone: "key {query.c}\nalgorithm token_bucket\nrate 20/1h"},
		{path: "/fw", zone: "key {query.c}\nalgorithm fixed_window\nrate 20/1h"},
		{path: "/swl", zone: "key {query.c}\nalgorithm sliding_window_log\nrate 20/1h"},
	}
	block := func(a, b string) string {
		return "redis {\nshards " + a + " " + b + "\ntimeout " + redisTimeout + "\n}"
	}

	up1, up2 := redistest.Start(t), redistest.Start(t)
	caddyproc.Start(t, redisSite(block(up1.Addr(), up2.Addr()), routes...))
	want := infoInt(t, up1, "memory", "number_of_cached_scripts")

	live := redistest.Start(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	inst := caddyproc.Start(t, redisSite(block(live.Addr(), dead), routes...))
	if got := infoInt(t, live, "memory", "number_of_cached_scripts"); got < want {
		t.Errorf("with the other shard down, the live shard caches %d scripts after the warm start; with both up a shard caches %d\ncaddy log:\n%s", got, want, inst.Log())
	}
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// testShards are standalone servers for a sharded store
// (storetest.Shards, with the helpers these tests add).
type testShards storetest.Shards

// startShards starts n standalone servers.
func startShards(t *testing.T, n int) testShards {
	t.Helper()
	return testShards(storetest.StartShards(t, n))
}

func (s testShards) addrs() []string { return storetest.Shards(s).Addrs() }

// ring is a client over the shards as Config.NewClient makes it,
// closed by t.Cleanup.
func (s testShards) ring(t *testing.T) *redis.Ring {
	t.Helper()
	return newShardsClient(t, Config{Shards: s.addrs()})
}

func newShardsClient(t *testing.T, cfg Config) *redis.Ring {
	t.Helper()
	c, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*redis.Ring)
}

// dbSizes is the number of keys on each shard.
func (s testShards) dbSizes(t *testing.T) []int64 {
	t.Helper()
	sizes := make([]int64, len(s))
	for i, srv := range s {
		n, err := srv.Client(t).DBSize(context.Background()).Result()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", srv.Addr(), err)
		}
		sizes[i] = n
	}
	return sizes
}

// TestShardHashOrderFree: the shard of a key depends on the shards' names,
// not on the order they are listed in, spreads keys evenly, and a shard
// added to the list takes keys only from the others (about a quarter of
// them for a fourth shard) without moving any between the others.
func TestShardHashOrderFree(t *testing.T) {
	names := []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}
	h := newShardHash(names)
	reversed := newShardHash([]string{names[2], names[1], names[0]})
	four := newShardHash(append(slices.Clone(names), "10.0.0.4:6379"))
	counts := map[string]int{}
	const keys = 30000
	moved := 0
	for i := range keys {
		k := fmt.Sprintf("%032x", i*2654435761)
		s := h.Get(k)
		if r := reversed.Get(k); r != s {
			t.Fatalf("key %s: shard %s, or %s with the list reversed", k, s, r)
		}
		counts[s]++
		if f := four.Get(k); f != s {
			if f != "10.0.0.4:6379" {
				t.Fatalf("key %s moved from %s to %s when a fourth shard was added", k, s, f)
			}
			moved++
		}
	}
	for _, n := range names {
		if c := counts[n]; c < keys/3*9/10 || c > keys/3*11/10 {
			t.Errorf("shard %s holds %d of %d keys, want a third within 10%%: %v", n, c, keys, counts)
		}
	}
	if moved < keys/4*9/10 || moved > keys/4*11/10 {
		t.Errorf("a fourth shard took %d of %d keys, want about a quarter", moved, keys)
	}
	if got := newShardHash(nil).Get("k"); got != "" {
		t.Errorf("no shards: got %q", got)
	}
}

// TestAlgorithmCasesRedisShards: a store on three shards decides every
// case of the shared table like the memory store.
func TestAlgorithmCasesRedisShards(t *testing.T) {
	storetest.RunAlgorithmCases(t, redisCaseStore(startShards(t, 3).ring(t)))
}

// TestRedisShardsSpreadKeys: 90 client keys decided at once on three
// shards land on all three, each key on the shard the Ring names for it,
// and every store's scripts are on every shard after Preload.
func TestRedisShardsSpreadKeys(t *testing.T) {
	shards := startShards(t, 3)
	ring := shards.ring(t)
	ctx := context.Background()
	r := newPreloadedRedis(t, ring, limiter.Policy{Algorithm: limiter.SlidingWindowCounter, Events: 10, Window: time.Minute}, Options{Zone: "spread", Timeout: time.Second})
	for _, s := range shards {
		ok, err := s.Client(t).ScriptExists(ctx, r.script.Hash(), r.batchScript.Hash()).Result()
		if err != nil || !ok[0] || !ok[1] {
			t.Errorf("shard %s: scripts loaded %v, %v; want both", s.Addr(), ok, err)
		}
	}
	takeForClients(t, r, 90, 9)
	sizes := shards.dbSizes(t)
	t.Logf("keys per shard: %v", sizes)
	for i, n := range sizes {
		if n < 10 {
			t.Errorf("shard %d holds %d keys: want each of the 3 shards to hold a share of 90 clients (%v)", i, n, sizes)
		}
	}
	for _, s := range shards {
		keys, err := s.Client(t).Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			c, err := ring.GetShardClientForKey(k)
			if err != nil || c.Options().Addr != s.Addr() {
				t.Errorf("key %s is on %s, but the Ring names %v (%v)", k, s.Addr(), c.Options().Addr, err)
			}
		}
	}
}

// TestRedisShardDown: with one of three shards stopped, its keys fail
// (at once, and soon without asking it: its breaker opens) while the
// other shards' keys go on deciding exactly, nothing moves to another
// shard, and the store reports itself down. The shard's keys start afresh
// once it returns, without its data.
func TestRedisShardDown(t *testing.T) {
	shards := startShards(t, 3)
	ring := shards.ring(t)
	ctx := context.Background()
	breaker, err := NewBreakerWith(BreakerOptions{After: 20 * time.Millisecond, OpenFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 5
	r := newTestRedis(t, ring, limiter.Policy{Algorithm: limiter.FixedWindow, Events: limit, Window: time.Hour},
		Options{Zone: "down", Timeout: time.Second, Breaker: breaker})
	storetest.AwayFromHourEnd()

	// Two client keys per shard, each taken twice.
	keysOn := map[string][]string{}
	for i := 0; len(keysOn) < 3 || slices.ContainsFunc(shards.addrs(), func(a string) bool { return len(keysOn[a]) < 2 }); i++ {
		k := fmt.Sprint("client-", i)
		s := r.shardOf(r.Key(k))
		if len(keysOn[s]) < 2 {
			keysOn[s] = append(keysOn[s], k)
			for range 2 {
				storetest.MustAdmit(t, r, k)
			}
		}
	}
	dead := shards[1]
	dead.Stop()

	for _, k := range keysOn[dead.Addr()] {
		start := time.Now()
		_, err := r.Take(ctx, k, 1)
		if err == nil {
			t.Fatalf("%s on the stopped shard: decided", k)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("%s on the stopped shard: failed after %v, want at once", k, took)
		}
	}
	// Keep failing past breaker_after, so the dead shard's breaker opens.
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, err := r.Take(ctx, keysOn[dead.Addr()][0], 1)
		if errors.Is(err, ErrUnavailable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped shard's breaker did not open: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r.Up() {
		t.Error("Up with a shard's breaker open")
	}
	for _, a := range []string{shards[0].Addr(), shards[2].Addr()} {
		for _, k := range keysOn[a] {
			for i := 3; i <= limit; i++ {
				d := storetest.MustAdmit(t, r, k)
				if d.Remaining != int64(limit-i) {
					t.Fatalf("%s on a live shard, take %d: remaining %d, want %d", k, i, d.Remaining, limit-i)
				}
			}
			if d, err := r.Take(ctx, k, 1); err != nil || d.Allowed {
				t.Fatalf("%s on a live shard past its limit: %+v, %v; want refused", k, d, err)
			}
		}
	}
	// Nothing of the dead shard's moved to the live ones: they hold the
	// keys they held.
	for _, i := range []int{0, 2} {
		n, err := shards[i].Client(t).DBSize(ctx).Result()
		if err != nil || n != 2 {
			t.Errorf("shard %d holds %d keys (%v), want its own 2", i, n, err)
		}
	}

	dead.Restart()
	breaker.shard(dead.Addr()).until.Store(0) // rather than wait an hour
	for _, k := range keysOn[dead.Addr()] {
		d := storetest.MustAdmit(t, r, k)
		if d.Remaining != limit-1 {
			t.Errorf("%s after its shard returned empty: remaining %d, want %d (afresh)", k, d.Remaining, limit-1)
		}
	}
	if !r.Up() {
		t.Error("down after every shard answers again")
	}
}

// TestRedisShardsNoScript: a shard that lost its scripts (a restart, a
// SCRIPT FLUSH) gets them again with the next decisions, pipelined or not,
// while the other shards' decisions go on.
func TestRedisShardsNoScript(t *testing.T) {
	shards := startShards(t, 3)
	ring := shards.ring(t)
	ctx := context.Background()
	r := newPreloadedRedis(t, ring, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour}, Options{Zone: "noscript", Timeout: time.Second})
	if err := shards[0].Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			if d, err := r.Take(ctx, fmt.Sprint("c", i), 1); err != nil || !d.Allowed {
				t.Errorf("c%d: %+v, %v", i, d, err)
			}
		})
	}
	wg.Wait()
	if ok, err := shards[0].Client(t).ScriptExists(ctx, r.script.Hash()).Result(); err != nil || !ok[0] {
		t.Errorf("the flushed shard's script after decisions: %v, %v", ok, err)
	}
}

// TestRedisShardsSlotsRenewed: concurrency slots held on keys of every
// shard are renewed on their own shards, in one call per shard, and
// nothing is written to a shard a key does not belong to.
func TestRedisShardsSlotsRenewed(t *testing.T) {
	shards := startShards(t, 3)
	ring := shards.ring(t)
	ctx := context.Background()
	r := newPreloadedRedis(t, ring, limiter.Policy{Algorithm: limiter.Concurrency, Events: 2, Window: time.Hour}, Options{Zone: "slots", Timeout: time.Second})
	for i := range 30 {
		storetest.MustAdmit(t, r, fmt.Sprint("c", i))
	}
	sizes := shards.dbSizes(t)
	for _, s := range shards {
		if err := s.Client(t).ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.renewSlots(ctx); err != nil {
		t.Fatal(err)
	}
	for i, s := range shards {
		calls, err := storetest.ScriptCalls(ctx, s.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		if sizes[i] > 0 && calls != 1 {
			t.Errorf("shard %s with %d keys: %d renewal calls, want 1", s.Addr(), sizes[i], calls)
		}
	}
	if after := shards.dbSizes(t); !slices.Equal(after, sizes) {
		t.Errorf("keys per shard %v after renewal, %v before: a renewal wrote a key on another shard", after, sizes)
	}
	for i := range 30 {
		// Each key still holds its one slot: one more fits, then none.
		storetest.MustAdmit(t, r, fmt.Sprint("c", i))
		if d, err := r.Take(ctx, fmt.Sprint("c", i), 1); err != nil || d.Allowed {
			t.Fatalf("c%d: a third slot: %+v, %v", i, d, err)
		}
	}
}

// BenchmarkShardOf measures what shards add to each decision: naming the
// shard of a Redis key (the Ring's hash of its hash tag over three
// shards) and finding that shard's breaker.
func BenchmarkShardOf(b *testing.B) {
	c, err := Config{Shards: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}}.NewClient()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	r, err := New(c, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}, Options{Zone: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = r.Key(fmt.Sprint("client-", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := keys[i%len(keys)]
		if br, p := r.routeOf(k); br == nil || p == nil {
			b.Fatal("no shard")
		}
	}
}

// TestRingSendsNoClientSetinfo: shard connections send no CLIENT SETINFO,
// as docs/redis.md promises of every connection (the ACL rule cannot grant it
// on Redis 7.0; later servers log every denial). Guards against: newRing
// copied the options field by field and left DisableIdentity out.
func TestRingSendsNoClientSetinfo(t *testing.T) {
	c, err := Config{Shards: []string{"127.0.0.1:1", "127.0.0.1:2"}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ring := c.(*redis.Ring)
	for _, s := range ring.GetShardClients() {
		if !s.Options().DisableIdentity {
			t.Errorf("shard %s: DisableIdentity false: its connections send CLIENT SETINFO", s.Options().Addr)
		}
	}
}

// eachTopology runs f as a subtest on each kind of deployment a store's
// many-key calls split differently on: one server, a Cluster of three
// (every key its own slot) and three shards.
func eachTopology(t *testing.T, f func(t *testing.T, client redis.UniversalClient)) {
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) }},
		{"shards", func(t *testing.T) redis.UniversalClient { return startShards(t, 3).ring(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) { f(t, tc.client(t)) })
	}
}

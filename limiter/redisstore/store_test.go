package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// redisCaseStore opens stores on client for runAlgorithmCases: each case gets
// its own zone, and the explicit-time hook replaces Redis TIME.
func redisCaseStore(client redis.UniversalClient) storetest.CaseStore {
	var n atomic.Int64
	return func(t *testing.T, p limiter.Policy) (limiter.Store, func(int64)) {
		clock := &testutil.Clock{}
		r, err := New(client, p, Options{
			Zone:    fmt.Sprintf("case%d-%s", n.Add(1), t.Name()),
			Timeout: 5 * time.Second,
			Clock:   clock,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r, clock.SetMicro
	}
}

func TestAlgorithmCasesRedis(t *testing.T) {
	s := redistest.Start(t)
	storetest.RunAlgorithmCases(t, redisCaseStore(s.Client(t)))
}

func TestAlgorithmCasesRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	storetest.RunAlgorithmCases(t, redisCaseStore(c.Client(t)))
}

// TestCostBelowOneRedis: the same cases as TestCostBelowOneMemory, on
// Redis (storetest.RunCostBelowOneCases).
func TestCostBelowOneRedis(t *testing.T) {
	storetest.RunCostBelowOneCases(t, redisCaseStore(redistest.Start(t).Client(t)))
}

// TestResetCasesRedis runs the shared cases of give-backs across an admin
// reset (storetest.RunResetCases) against Redis, on a test clock that
// stands still, as the memory store's tests run them: the scripts tell
// the states apart by their epochs, not their times.
func TestResetCasesRedis(t *testing.T) {
	s := redistest.Start(t)
	storetest.RunResetCases(t, redisCaseStore(s.Client(t)))
}

// TestResetCasesRedisShards runs them on shards, where LeaseMany and
// ReturnMany send the batch script to the key's shard.
func TestResetCasesRedisShards(t *testing.T) {
	storetest.RunResetCases(t, redisCaseStore(startShards(t, 2).ring(t)))
}

// TestResetCasesRedisCluster runs them on a Cluster, where every give-back
// and lease goes alone.
func TestResetCasesRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	storetest.RunResetCases(t, redisCaseStore(c.Client(t)))
}

// redisPolicies is one policy per algorithm, for tests that run them all.
func redisPolicies(events int64, window time.Duration) map[limiter.Algorithm]limiter.Policy {
	m := make(map[limiter.Algorithm]limiter.Policy)
	for _, a := range limiter.Algorithms {
		m[a] = limiter.Policy{Algorithm: a, Events: events, Window: window}
	}
	return m
}

// newTestRedis opens a store and fails t on error.
func newTestRedis(t testing.TB, client redis.UniversalClient, p limiter.Policy, opts Options) *Store {
	t.Helper()
	r, err := New(client, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newPreloadedRedis is newTestRedis with its scripts loaded (Preload).
func newPreloadedRedis(t testing.TB, client redis.UniversalClient, p limiter.Policy, opts Options) *Store {
	t.Helper()
	r := newTestRedis(t, client, p, opts)
	if err := r.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// scanKeys lists every key of the client's database (every master's, for a
// Cluster, every shard's, for shards).
func scanKeys(t *testing.T, client redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Ring:
		err = c.ForEachShard(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("cannot scan a %T", client)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestRedisKeysHaveTTL drives every algorithm with Redis TIME, takes and
// returns included, and then finds every key in the database with a TTL no
// longer than its state needs plus the second of skew every key is kept
// for (lua/prelude.lua's pad; TestMixedClocksKeepFilledState).
func TestRedisKeysHaveTTL(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	const window = 2 * time.Second
	longest := map[limiter.Algorithm]time.Duration{
		limiter.TokenBucket:          window, // B/r with B = L
		limiter.LeakyBucket:          window,
		limiter.FixedWindow:          window,
		limiter.SlidingWindowLog:     window,
		limiter.SlidingWindowCounter: 2 * window, // the end of the next window
		limiter.Concurrency:          window,     // an unrenewed slot's life
	}
	for alg, p := range redisPolicies(5, window) {
		r := newTestRedis(t, client, p, Options{Zone: "ttl", Timeout: time.Second})
		for i := range 20 {
			key := fmt.Sprintf("client-%d", i)
			var last limiter.Admission
			for j := 0; j < 3+i%5; j++ {
				d, err := r.Take(ctx, key, 1)
				if err != nil {
					t.Fatalf("%s: take: %v", alg, err)
				}
				if d.Allowed {
					last = d
				}
			}
			if i%3 == 0 {
				if _, err := r.GiveBack(ctx, key, 1, last.Receipt); err != nil {
					t.Fatalf("%s: return: %v", alg, err)
				}
			}
		}
		// A key whose units all came back holds no state and no key.
		d, err := r.Take(ctx, "refunded", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%s: take: %v %+v", alg, err, d)
		}
		if _, err := r.GiveBack(ctx, "refunded", 1, d.Receipt); err != nil {
			t.Fatalf("%s: return: %v", alg, err)
		}
		if n, _ := client.Exists(ctx, r.Key("refunded")).Result(); n != 0 {
			t.Errorf("%s: a fully refunded key is still stored", alg)
		}
	}
	keys := scanKeys(t, client)
	if len(keys) < 100 {
		t.Fatalf("found %d keys, want one per client and algorithm", len(keys))
	}
	suffixes := map[string]limiter.Algorithm{"tb": limiter.TokenBucket, "lb": limiter.LeakyBucket, "fw": limiter.FixedWindow, "swl": limiter.SlidingWindowLog, "swc": limiter.SlidingWindowCounter, "cc": limiter.Concurrency}
	for _, k := range keys {
		ttl, err := client.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		tail := strings.Split(k, "}:")[1]
		alg := suffixes[tail[:strings.IndexByte(tail, ':')]]
		if most := longest[alg] + time.Second + time.Millisecond; ttl <= 0 || ttl > most {
			t.Errorf("key %s (%s): TTL %v, want in (0, %v]", k, alg, ttl, most)
		}
	}
}

func TestRedisKeyNames(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	secrets := []string{"sk_live_0123456789abcdef", "203.0.113.7", "{tag}", "user@example.com"}
	for alg, p := range redisPolicies(5, time.Minute) {
		r := newTestRedis(t, client, p, Options{Prefix: "fg{x}:", Zone: "api{v2}%", Timeout: time.Second})
		for _, k := range secrets {
			if _, err := r.Take(ctx, k, 1); err != nil {
				t.Fatalf("%s: %v", alg, err)
			}
		}
	}
	pattern := regexp.MustCompile(`^fg%7Bx%7D:api%7Bv2%7D%25:\{[0-9a-f]{32}\}:((tb|lb|fw|swl|swc):5/60000000|cc:shared)$`)
	keys := scanKeys(t, client)
	if len(keys) != len(secrets)*len(limiter.Algorithms) {
		t.Errorf("found %d keys, want %d", len(keys), len(secrets)*len(limiter.Algorithms))
	}
	for _, k := range keys {
		if !pattern.MatchString(k) {
			t.Errorf("key %q does not have the form prefix zone:{hash}:algorithm:policy (cc:shared for concurrency, whose limits share it)", k)
		}
		for _, secret := range secrets {
			if strings.Contains(k, secret) {
				t.Errorf("key %q contains the client key %q", k, secret)
			}
		}
	}
	// Every instance names a client's key the same way: the hash is not
	// seeded. A store of another limit names it otherwise.
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 1, Window: time.Second}
	a := newTestRedis(t, client, p, Options{Zone: "z"})
	b := newTestRedis(t, client, p, Options{Zone: "z"})
	if a.Key("client") != b.Key("client") || a.Key("client") == a.Key("other") {
		t.Errorf("keys %q, %q, %q", a.Key("client"), b.Key("client"), a.Key("other"))
	}
	for _, q := range []limiter.Policy{
		{Algorithm: limiter.TokenBucket, Events: 2, Window: 2 * time.Second},
		{Algorithm: limiter.TokenBucket, Events: 1, Window: time.Second, Burst: 3},
		{Algorithm: limiter.LeakyBucket, Events: 1, Window: time.Second},
	} {
		if c := newTestRedis(t, client, q, Options{Zone: "z"}); c.Key("client") == a.Key("client") {
			t.Errorf("%s and %s share the key %q", p, q, a.Key("client"))
		}
	}
}

// TestRedisLimitsOfOneZoneNameKeepApart: two stores of one zone name with
// different limits (two handlers declaring the zone, or a reload that
// changes its limit) each enforce their own, never reading the other's
// state. On a shared key name the 5/1h window read the 100/1m one's
// window index as an hour's and admitted 40 in ten minutes.
func TestRedisLimitsOfOneZoneNameKeepApart(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	for _, pair := range [][2]limiter.Policy{
		{{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Minute}, {Algorithm: limiter.FixedWindow, Events: 5, Window: time.Hour}},
		{{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Minute}, {Algorithm: limiter.TokenBucket, Events: 5, Window: time.Hour}},
		{{Algorithm: limiter.SlidingWindowLog, Events: 100, Window: time.Minute}, {Algorithm: limiter.SlidingWindowLog, Events: 5, Window: time.Hour}},
		{{Algorithm: limiter.SlidingWindowCounter, Events: 100, Window: time.Minute}, {Algorithm: limiter.SlidingWindowCounter, Events: 5, Window: time.Hour}},
	} {
		clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
		opts := Options{Zone: "shared-" + string(pair[0].Algorithm), Timeout: time.Second, Clock: clock}
		fast := newTestRedis(t, client, pair[0], opts)
		slow := newTestRedis(t, client, pair[1], opts)
		admitted := 0
		for minute := 0; minute < 10; minute++ {
			for i := 0; i < 10; i++ {
				if _, err := fast.Take(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
				d, err := slow.Take(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
				// The sliding counter's reset is the end of the next window.
				if reset := d.ResetAfter; reset > 2*time.Hour {
					t.Errorf("%s: reset after %v, beyond its windows", pair[1], reset)
				}
			}
			clock.Advance(time.Minute)
		}
		if admitted != 5 {
			t.Errorf("%s beside %s on one zone name admitted %d in ten minutes, want 5", pair[1], pair[0], admitted)
		}
	}
}

// takeForClients has n clients ("client-0", ...) take one unit each from r
// at once, so most decisions go out in pipelines (a Cluster or Ring client
// splits them by server), and fails t unless each is admitted with
// remaining left or none was pipelined.
func takeForClients(t *testing.T, r *Store, n int, remaining int64) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			d, err := r.Take(context.Background(), fmt.Sprintf("client-%d", i), 1)
			if err != nil || !d.Allowed || d.Remaining != remaining {
				t.Errorf("client-%d: %+v %v", i, d, err)
			}
		})
	}
	close(start)
	wg.Wait()
	checkPipelined(t, []*Store{r})
}

func TestRedisClusterSpreadsKeys(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	client := c.Client(t)
	ctx := context.Background()
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.SlidingWindowCounter, Events: 10, Window: time.Minute}, Options{Zone: "spread", Timeout: time.Second})
	takeForClients(t, r, 90, 9)
	var mu sync.Mutex
	var sizes []int64
	err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 {
		t.Fatalf("%d masters, want 3", len(sizes))
	}
	for _, n := range sizes {
		if n < 10 {
			t.Errorf("keys per master %v: want each of the 3 masters to hold a share of 90 clients", sizes)
		}
	}
}

func TestRedisScriptCacheLoss(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Minute}, Options{Zone: "noscript", Timeout: time.Second})
	take := func(when string, wantRemaining int64) {
		t.Helper()
		d, err := r.Take(ctx, "k", 1)
		if err != nil {
			t.Fatalf("take %s: %v", when, err)
		}
		if !d.Allowed || d.Remaining != wantRemaining {
			t.Fatalf("take %s: %+v, want allowed with %d remaining", when, d, wantRemaining)
		}
	}
	take("first", 9)
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	take("after SCRIPT FLUSH", 8)
	s.Restart()
	take("after a restart", 9) // memory was lost with the restart
}

// TestRedisTimeoutWhenPaused checks that a stalled Redis costs a decision
// no more than the timeout and a small margin, also while more callers
// wait than the pool has connections.
func TestRedisTimeoutWhenPaused(t *testing.T) {
	const timeout = 20 * time.Millisecond
	for _, tt := range []struct {
		name    string
		callers int
	}{
		{"one caller", 1},
		{"pool exhausted", 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := redistest.Start(t)
			client, err := Config{Addresses: []string{s.Addr()}, PoolSize: 2}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			ctx := context.Background()
			r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}, Options{Zone: "pause", Timeout: timeout})
			if _, err := r.Take(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
			s.Pause()
			defer s.Resume()
			for round := range 3 { // the first on a pooled connection, then on fresh ones
				var wg sync.WaitGroup
				for c := range tt.callers {
					wg.Go(func() {
						start := time.Now()
						_, err := r.Take(ctx, "k", 1)
						took := time.Since(start)
						if err == nil {
							t.Error("Take answered while Redis was paused")
							return
						}
						// Past DefaultBreakerAfter of failures on a loaded machine,
						// the breaker answers without waiting.
						if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrUnavailable) {
							t.Errorf("round %d caller %d: error %v wraps neither ErrStoreTimeout nor ErrStoreUnavailable", round, c, err)
						}
						if took > timeout+100*time.Millisecond {
							t.Errorf("round %d caller %d: failed after %v, want within %v and a small margin", round, c, took, timeout)
						}
						if c == 0 {
							t.Logf("round %d: failed after %v: %v", round, took, err)
						}
					})
				}
				wg.Wait()
			}
			s.Resume()
			testutil.Eventually(t, "a decision after resuming", func() error {
				d, err := r.Take(ctx, "k", 1)
				if err == nil && !d.Allowed {
					t.Fatalf("after resume: %+v", d)
				}
				return err
			})
		})
	}
}

// TestRedisSentinel decides through a failover client, with a Sentinel
// that lets anyone ask it and with one that requires a password of its
// own, which a client without it cannot get past.
func TestRedisSentinel(t *testing.T) {
	for _, password := range []string{"", "sentinel-secret"} {
		t.Run("password="+password, func(t *testing.T) {
			s := redistest.StartSentinelAuth(t, password)
			ctx := context.Background()
			policy := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 3, Window: time.Minute}
			if password != "" {
				client, err := Config{Addresses: []string{s.Addr()}, MasterName: s.MasterName}.NewClient()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { client.Close() })
				r := newTestRedis(t, client, policy, Options{Zone: "sentinel", Timeout: time.Second})
				if _, err := r.Take(ctx, "k", 1); err == nil {
					t.Fatal("a client without the Sentinel's password got a decision")
				}
			}
			client, err := Config{Addresses: []string{s.Addr()}, MasterName: s.MasterName, SentinelPassword: password}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			r := newTestRedis(t, client, policy, Options{Zone: "sentinel", Timeout: time.Second})
			for i, want := range []bool{true, true, true, false} {
				d, err := r.Take(ctx, "k", 1)
				if err != nil {
					t.Fatalf("take %d: %v", i, err)
				}
				if d.Allowed != want {
					t.Fatalf("take %d: %+v, want allowed=%v", i, d, want)
				}
			}
			if n, err := s.Master.Client(t).Exists(ctx, r.Key("k")).Result(); err != nil || n != 1 {
				t.Fatalf("the key is not on the master Sentinel names: %d %v", n, err)
			}
		})
	}
}

func TestRedisConcurrencySlots(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	const window = 300 * time.Millisecond
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.Concurrency, Events: 2, Window: window}, Options{Zone: "slots", Timeout: time.Second})

	// Released slots free their units at once.
	d, err := r.Take(ctx, "released", 2)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take 2: %+v %v", d, err)
	}
	if back, err := r.GiveBack(ctx, "released", 2, d.Receipt); err != nil || back.Remaining != 2 {
		t.Fatalf("return: %+v %v", back, err)
	}

	// Slots never released nor renewed (a crashed instance) lapse after
	// the window.
	start := time.Now()
	for range 2 {
		d, err := r.Take(ctx, "crashed", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("take: %+v %v", d, err)
		}
		r.release(r.slotName(d.Receipt.Slot)) // the instance dies: nobody renews the slot
	}
	if d, err := r.Take(ctx, "crashed", 1); err != nil || d.Allowed {
		t.Fatalf("third take while two are in flight: %+v %v", d, err)
	}
	time.Sleep(time.Until(start.Add(window + 50*time.Millisecond)))
	if d, err := r.Take(ctx, "crashed", 1); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("take after the slots lapsed: %+v %v", d, err)
	}
}

func TestNewRedisRefuses(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	day := 24 * time.Hour
	d := time.Duration(0)
	for _, p := range []limiter.Policy{
		{Algorithm: limiter.SlidingWindowCounter, Events: 30_000, Window: day},
		{Algorithm: limiter.TokenBucket, Events: 7, Window: 7*day + time.Microsecond, Burst: 1 << 20},
		{Algorithm: limiter.LeakyBucket, Events: 3, Window: time.Second, MaxDelay: func() *time.Duration { d := 50_000 * day; return &d }()},
		{Algorithm: limiter.FixedWindow, Events: 1, Window: 500 * day},
		{Algorithm: limiter.TokenBucket, Events: 0, Window: time.Second},
	} {
		if _, err := New(client, p, Options{Zone: "z"}); err == nil {
			t.Errorf("policy %s: accepted", p)
		}
	}
	for _, p := range []limiter.Policy{
		{Algorithm: limiter.SlidingWindowCounter, Events: 20_000, Window: day},
		{Algorithm: limiter.TokenBucket, Events: 1_000_000, Window: day},
		{Algorithm: limiter.LeakyBucket, Events: 100, Window: time.Minute, MaxDelay: &d},
	} {
		if _, err := New(client, p, Options{Zone: "z"}); err != nil {
			t.Errorf("policy %s: %v", p, err)
		}
	}
	deaf := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer deaf.Close()
	if _, err := New(deaf, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 1, Window: time.Second}, Options{}); err == nil {
		t.Error("accepted a client that ignores context deadlines")
	}
	if _, err := New(nil, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 1, Window: time.Second}, Options{}); err == nil {
		t.Error("accepted a nil client")
	}
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 5, Window: time.Second}, Options{})
	for _, cost := range []int64{0, -1, 6} {
		if _, err := r.Take(context.Background(), "k", cost); err == nil {
			t.Errorf("cost %d accepted", cost)
		}
	}
}

// TestRedisAccuracy races 600 requests for one key from three clients (three
// instances sharing a Redis) and counts what was let through: exactly the
// quota, never one more.
func TestRedisAccuracy(t *testing.T) {
	for _, srv := range []struct {
		name string
		args []string
	}{
		{"redis clock", nil},
		// A server that refuses TIME in scripts: the stores find out at
		// their first decision (no Preload here) and send each
		// instance's clock, which on one machine is one clock.
		{"instance clock", redistest.WithoutTime},
	} {
		t.Run(srv.name, func(t *testing.T) { redisAccuracy(t, redistest.StartArgs(t, srv.args...), srv.args != nil) })
	}
}

func redisAccuracy(t *testing.T, s *redistest.Server, instanceClock bool) {
	ctx := context.Background()
	checkGoroutines := testutil.GoroutineCheck(t)

	clients := instanceClients(t, []string{s.Addr()}, 3)
	storetest.AwayFromHourEnd() // a fixed or counted window must not turn over mid-test

	const requests, quota = 600, 100
	zero := time.Duration(0)
	cases := []struct {
		name string
		p    limiter.Policy
		want int64
	}{
		{"token_bucket", limiter.Policy{Algorithm: limiter.TokenBucket, Events: quota, Window: time.Hour}, quota},
		{"fixed_window", limiter.Policy{Algorithm: limiter.FixedWindow, Events: quota, Window: time.Hour}, quota},
		{"sliding_window_log", limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: quota, Window: time.Hour}, quota},
		{"sliding_window_counter", limiter.Policy{Algorithm: limiter.SlidingWindowCounter, Events: quota, Window: time.Hour}, quota},
		// The default max_delay queues B requests; max_delay 0 admits one.
		{"leaky_bucket", limiter.Policy{Algorithm: limiter.LeakyBucket, Events: quota, Window: time.Hour}, quota},
		{"leaky_bucket_no_delay", limiter.Policy{Algorithm: limiter.LeakyBucket, Events: quota, Window: time.Hour, MaxDelay: &zero}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stores := make([]*Store, len(clients))
			for i, c := range clients {
				stores[i] = newTestRedis(t, c, tc.p, Options{Zone: "accuracy-" + tc.name, Timeout: 30 * time.Second})
			}
			var allowed, failed atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range requests {
				wg.Go(func() {
					<-start
					d, err := stores[i%len(stores)].Take(ctx, "hot", 1)
					switch {
					case err != nil:
						failed.Add(1)
					case d.Allowed:
						allowed.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if failed.Load() != 0 || allowed.Load() != tc.want {
				t.Fatalf("%d of %d allowed, %d failed; want exactly %d allowed", allowed.Load(), requests, failed.Load(), tc.want)
			}
			for i, st := range stores {
				if st.InstanceClock() != instanceClock {
					t.Fatalf("store %d on the instance's clock: %v, want %v", i, st.InstanceClock(), instanceClock)
				}
			}
			checkPipelined(t, stores)
		})
	}

	t.Run("concurrency", func(t *testing.T) {
		const limit = 10
		p := limiter.Policy{Algorithm: limiter.Concurrency, Events: limit, Window: time.Hour}
		stores := make([]*Store, len(clients))
		for i, c := range clients {
			stores[i] = newTestRedis(t, c, p, Options{Zone: "accuracy-concurrency", Timeout: 30 * time.Second})
		}
		var inFlight, most, allowed, failed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range requests {
			wg.Go(func() {
				<-start
				st := stores[i%len(stores)]
				d, err := st.Take(ctx, "hot", 1)
				if err != nil {
					failed.Add(1)
					return
				}
				if !d.Allowed {
					return
				}
				allowed.Add(1)
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(time.Millisecond)
				inFlight.Add(-1)
				if _, err := st.GiveBack(ctx, "hot", 1, d.Receipt); err != nil {
					failed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if failed.Load() != 0 || most.Load() > limit || allowed.Load() < limit {
			t.Fatalf("%d failed, at most %d in flight (limit %d), %d allowed", failed.Load(), most.Load(), limit, allowed.Load())
		}
		checkPipelined(t, stores)
		// Every slot came back.
		d, err := stores[0].Take(ctx, "hot", 1)
		if err != nil || d.Remaining != limit-1 {
			t.Fatalf("after all returned: %+v %v", d, err)
		}
		if _, err := stores[0].GiveBack(ctx, "hot", 1, d.Receipt); err != nil {
			t.Fatal(err)
		}
	})

	if err := storetest.CloseClients(clients); err != nil {
		t.Errorf("close: %v", err)
	}
	// Closed clients leave no goroutines behind.
	checkGoroutines()
}

// checkPipelined fails t unless some of the stores' decisions shared round
// trips: the accuracy above must hold for pipelined scripts too.
func checkPipelined(t *testing.T, stores []*Store) {
	t.Helper()
	var n int64
	for _, st := range stores {
		n += st.pipelinedCalls()
	}
	if n == 0 {
		t.Error("no decision was sent in a pipeline: the concurrent requests did not exercise pipelining")
	} else {
		t.Logf("%d decisions sent in pipelines", n)
	}
}

// BenchmarkRedisTake measures decisions per second against one local
// redis-server with 64 concurrent callers spread over 10,000 client keys.
func BenchmarkRedisTake(b *testing.B) {
	s := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 64, ContextTimeoutEnabled: true})
	b.Cleanup(func() { client.Close() })
	for _, alg := range limiter.Algorithms {
		b.Run(string(alg), func(b *testing.B) {
			r := newTestRedis(b, client, limiter.Policy{Algorithm: alg, Events: 1000, Window: time.Minute}, Options{Zone: "bench", Timeout: time.Second})
			var seq atomic.Int64
			var failed atomic.Int64
			b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				key := make([]byte, 0, 16)
				for pb.Next() {
					key = fmt.Appendf(key[:0], "client-%d", seq.Add(1)%10_000)
					d, err := r.Take(ctx, string(key), 1)
					if err != nil {
						failed.Add(1)
						continue
					}
					if alg == limiter.Concurrency && d.Allowed {
						if _, err := r.GiveBack(ctx, string(key), 1, d.Receipt); err != nil {
							failed.Add(1)
						}
					}
				}
			})
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d decisions failed", n)
			}
		})
	}
}

// stepDiffClock sets clock for the next step of a comparison and returns
// the time it set: now again on half the steps, now advanced by up to span
// on the others (see newStoreDiff).
func stepDiffClock(rng *rand.Rand, clock *testutil.Clock, now, span int64) int64 {
	if rng.IntN(2) == 0 {
		now += rng.Int64N(span)
	}
	clock.SetMicro(now)
	return now
}

// newStoreDiff is a memory store and a Redis store (zone) of p on one
// test clock, for a comparison decision for decision, with the time it
// starts at, the span a step may advance it by and the largest cost to
// draw. Half the steps keep the time, the others advance it by up to span,
// about the time one unit takes to come back, so quotas run out and
// refill; concurrency slots must not lapse, which memory lacks. Costs go
// up to a twentieth of the quota, so large quotas run out too.
func newStoreDiff(t *testing.T, client redis.UniversalClient, p limiter.Policy, zone string) (mem *limiter.Memory, red *Store, clock *testutil.Clock, now, span, maxCost int64) {
	t.Helper()
	now = 1_763_800_000_000_000 // a real epoch, so absolute times are large
	clock = &testutil.Clock{}
	mem, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	red = newTestRedis(t, client, p, Options{Zone: zone, Timeout: 5 * time.Second, Clock: clock})
	span = 2*p.Window.Microseconds()/p.Events + 2
	if p.Algorithm == limiter.Concurrency {
		span = 1000
	}
	if p.Calendar != nil {
		// Calendar days, from a week before Berlin's 23-hour day.
		span, now = 3*time.Hour.Microseconds(), time.Date(2026, 3, 22, 0, 0, 0, 0, time.UTC).UnixMicro()
	}
	maxCost = min(p.MaxCost(), max(3, p.MaxCost()/20))
	return mem, red, clock, now, span, maxCost
}

// TestRedisMatchesMemory steps the memory store and the Redis store through
// the same random requests and refunds (alone, several in one call, and in
// a lease's renewal) under policies chosen to stress the
// arithmetic (large and coprime L and W, bursts, long delays, a quota that
// needs the wide state form), and wants the same decision every time.
func TestRedisMatchesMemory(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	delay := 1500 * time.Millisecond
	policies := []limiter.Policy{
		{Algorithm: limiter.TokenBucket, Events: 10_000_019, Window: 3 * time.Microsecond, Burst: 6},
		{Algorithm: limiter.TokenBucket, Events: 7, Window: 24 * time.Hour, Burst: 13},
		{Algorithm: limiter.TokenBucket, Events: 999_983, Window: time.Hour, Burst: 100},
		{Algorithm: limiter.LeakyBucket, Events: 13, Window: 7 * time.Second},
		{Algorithm: limiter.LeakyBucket, Events: 4099, Window: time.Minute, Burst: 50, MaxDelay: &delay},
		{Algorithm: limiter.FixedWindow, Events: 9, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.SlidingWindowLog, Events: 9, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.SlidingWindowCounter, Events: 11, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.SlidingWindowCounter, Events: 20_000, Window: 24 * time.Hour},
		{Algorithm: limiter.Concurrency, Events: 3, Window: time.Hour},
		{Algorithm: limiter.FixedWindow, Events: 9, Calendar: &limiter.Calendar{Period: limiter.Day, Location: testutil.MustLoad(t, "Europe/Berlin")}},
	}
	for i, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			mem, red, clock, now, span, maxCost := newStoreDiff(t, client, p, fmt.Sprintf("diff%d", i))
			var memTaken, redTaken []limiter.Admission
			var costs []int64
			outcomes, leases, renewals, many := map[bool]int{}, map[bool]int{}, map[bool]int{}, 0
			charges, partial := map[bool]int{}, 0
			// Groups of leases (LeaseMany), with a renewal or not, and
			// their renewals granted or not; gmem and gred are their
			// grants, which later renewals give back. grng draws them,
			// on keys of their own, so k's steps go as they did before.
			groups, groupRenewals := map[bool]int{}, map[bool]int{}
			var gmem, gred []groupGrant
			grng := rand.New(rand.NewPCG(uint64(i), 43))
			for step := range 400 {
				now = stepDiffClock(rng, clock, now, span)
				var dm, dr limiter.Admission
				var errm, errr error
				// forget removes admission j from those that may be given back.
				forget := func(j int) {
					memTaken = append(memTaken[:j], memTaken[j+1:]...)
					redTaken = append(redTaken[:j], redTaken[j+1:]...)
					costs = append(costs[:j], costs[j+1:]...)
				}
				leasing := p.Algorithm.Traits().Leases
				if len(memTaken) > 0 && rng.IntN(4) == 0 {
					j := rng.IntN(len(memTaken))
					switch {
					case len(memTaken) > 1 && rng.IntN(3) == 0:
						// Several admissions given back in one call; the
						// state afterwards is compared through a peek.
						var mb, rb []limiter.Return
						for range 2 + rng.IntN(min(3, len(memTaken)-1)) {
							j := rng.IntN(len(memTaken))
							mb = append(mb, limiter.Return{Key: "k", Units: costs[j], Taken: memTaken[j].Receipt})
							rb = append(rb, limiter.Return{Key: "k", Units: costs[j], Taken: redTaken[j].Receipt})
							forget(j)
						}
						errm, errr = mem.ReturnMany(ctx, mb), red.ReturnMany(ctx, rb)
						if errm == nil && errr == nil {
							dm.Decision, errm = mem.Peek(ctx, "k")
							dr.Decision, errr = red.Peek(ctx, "k")
						}
						many++
					case leasing && rng.IntN(2) == 0:
						// A renewal: part or all of an admission back,
						// then a lease, in one call.
						back := 1 + rng.Int64N(costs[j])
						cost := 1 + rng.Int64N(maxCost)
						want := cost + rng.Int64N(3*maxCost)
						dm, errm = mem.Renew(ctx, limiter.Return{Key: "k", Units: back, Taken: memTaken[j].Receipt}, cost, want)
						dr, errr = red.Renew(ctx, limiter.Return{Key: "k", Units: back, Taken: redTaken[j].Receipt}, cost, want)
						if dm.Granted() != dr.Granted() {
							t.Fatalf("step %d: renewal of %d for %d: memory granted %d, redis %d", step, want, cost, dm.Granted(), dr.Granted())
						}
						forget(j)
						if dm.Allowed && dr.Allowed {
							memTaken, redTaken, costs = append(memTaken, dm), append(redTaken, dr), append(costs, dm.Granted())
						}
						renewals[dm.Allowed]++
					case p.Algorithm.Traits().Charges && costs[j] > 1 && rng.IntN(3) == 0:
						// Part of an admission back, as when a response
						// costs less than was taken for it; the rest may be
						// given back later.
						back := 1 + rng.Int64N(costs[j]-1)
						dm.Decision, errm = mem.GiveBack(ctx, "k", back, memTaken[j].Receipt)
						dr.Decision, errr = red.GiveBack(ctx, "k", back, redTaken[j].Receipt)
						costs[j] -= back
						partial++
					default:
						dm.Decision, errm = mem.GiveBack(ctx, "k", costs[j], memTaken[j].Receipt)
						dr.Decision, errr = red.GiveBack(ctx, "k", costs[j], redTaken[j].Receipt)
						forget(j)
					}
				} else if p.Algorithm.Traits().Charges && rng.IntN(8) == 0 {
					// A charge of up to the whole quota, past the limit if
					// need be, so debts reach their cap.
					cost := 1 + rng.Int64N(p.MaxCost())
					dm, errm = mem.Charge(ctx, "k", cost)
					dr, errr = red.Charge(ctx, "k", cost)
					if dm.Granted() != dr.Granted() {
						t.Fatalf("step %d: charge of %d: memory charged %d, redis %d", step, cost, dm.Granted(), dr.Granted())
					}
					charges[dm.Granted() < cost]++
				} else {
					cost := 1 + rng.Int64N(maxCost)
					if leasing && rng.IntN(3) == 0 {
						// A lease: up to a few times the cost, so some
						// are cut short by what the limit has left.
						want := cost + rng.Int64N(3*maxCost)
						dm, errm = mem.TakeUpTo(ctx, "k", cost, want)
						dr, errr = red.TakeUpTo(ctx, "k", cost, want)
						if dm.Granted() != dr.Granted() {
							t.Fatalf("step %d: lease of %d for %d: memory granted %d, redis %d", step, want, cost, dm.Granted(), dr.Granted())
						}
						leases[dm.Granted() < want]++
						cost = dm.Granted()
					} else {
						dm, errm = mem.Take(ctx, "k", cost)
						dr, errr = red.Take(ctx, "k", cost)
					}
					if dm.Allowed && dr.Allowed {
						memTaken, redTaken, costs = append(memTaken, dm), append(redTaken, dr), append(costs, cost)
					}
				}
				if errm != nil || errr != nil {
					t.Fatalf("step %d: %v %v", step, errm, errr)
				}
				outcomes[dm.Allowed]++
				if dm.Allowed != dr.Allowed || dm.Remaining != dr.Remaining || dm.ResetAfter != dr.ResetAfter || dm.RetryAfter != dr.RetryAfter {
					t.Fatalf("step %d at %dus: memory %+v, redis %+v", step, now, dm, dr)
				}
				if p.Algorithm.Traits().Leases && grng.IntN(8) == 0 {
					// Several leases in one call (LeaseMany), as a near
					// cache sends the asks that queued: on keys g and h,
					// apart from k's steps, in order, one of them a
					// renewal when an earlier grant can give units back.
					// Each answer is compared, so one delivered to
					// another ask shows.
					var masks, rasks []limiter.LeaseAsk
					renew := -1
					for i := range 2 + grng.IntN(3) {
						c := 1 + grng.Int64N(maxCost)
						key := []string{"g", "h"}[grng.IntN(2)]
						a := limiter.LeaseAsk{Key: key, Cost: c, Want: c + grng.Int64N(3*maxCost)}
						ma, ra := a, a
						if renew < 0 && len(gmem) > 0 && grng.IntN(2) == 0 {
							j := grng.IntN(len(gmem))
							back := 1 + grng.Int64N(gmem[j].Granted())
							ma.Back = limiter.Return{Key: gmem[j].key, Units: back, Taken: gmem[j].Receipt}
							ra.Back = limiter.Return{Key: gmem[j].key, Units: back, Taken: gred[j].Receipt}
							ma.Key, ra.Key = gmem[j].key, gmem[j].key
							gmem, gred = slices.Delete(gmem, j, j+1), slices.Delete(gred, j, j+1)
							renew = i
						}
						masks, rasks = append(masks, ma), append(rasks, ra)
					}
					ma, ra := mem.LeaseMany(ctx, masks), red.LeaseMany(ctx, rasks)
					for i := range ma {
						gm, gr := ma[i].Admission, ra[i].Admission
						if ma[i].Err != nil || ra[i].Err != nil {
							t.Fatalf("step %d: ask %d of a group: %v %v", step, i, ma[i].Err, ra[i].Err)
						}
						if gm.Allowed != gr.Allowed || gm.Granted() != gr.Granted() || gm.Remaining != gr.Remaining || gm.ResetAfter != gr.ResetAfter || gm.RetryAfter != gr.RetryAfter {
							t.Fatalf("step %d: ask %d (%s) of a group of %d (renewal: ask %d): memory %+v, redis %+v", step, i, masks[i].Key, len(ma), renew, gm, gr)
						}
						if gm.Allowed {
							gmem, gred = append(gmem, groupGrant{gm, masks[i].Key}), append(gred, groupGrant{gr, masks[i].Key})
						}
						if i == renew {
							groupRenewals[gm.Allowed]++
						}
					}
					groups[renew >= 0]++
				}
			}
			if outcomes[true] == 0 || outcomes[false] == 0 {
				t.Errorf("%d allowed, %d denied: the steps should exercise both", outcomes[true], outcomes[false])
			}
			if p.Algorithm.Traits().Leases && (leases[true] == 0 || leases[false] == 0) {
				t.Errorf("%d leases cut short, %d whole: the steps should exercise both", leases[true], leases[false])
			}
			if p.Algorithm.Traits().Leases && (renewals[true] == 0 || renewals[false] == 0) {
				t.Errorf("%d renewals granted, %d refused: the steps should exercise both", renewals[true], renewals[false])
			}
			if many == 0 {
				t.Error("no refunds of several admissions in one call")
			}
			if p.Algorithm.Traits().Leases && (groups[true] == 0 || groups[false] == 0 || groupRenewals[true] == 0) {
				t.Errorf("%d groups of leases with a renewal (%d granted), %d without: the steps should exercise both", groups[true], groupRenewals[true], groups[false])
			}
			if p.Algorithm.Traits().Charges && (charges[true] == 0 || charges[false] == 0 || partial == 0) {
				t.Errorf("%d charges cut short by the cap, %d whole, %d partial refunds: the steps should exercise each", charges[true], charges[false], partial)
			}
		})
	}
}

// groupGrant is a grant of TestRedisMatchesMemory's groups of leases, and
// its key.
type groupGrant struct {
	limiter.Admission
	key string
}

func TestRedisUnreachable(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	const timeout = 50 * time.Millisecond
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Minute}, Options{Zone: "down", Timeout: timeout})
	s.Stop()
	for i := range 3 {
		start := time.Now()
		_, err := r.Take(context.Background(), "k", 1)
		took := time.Since(start)
		t.Logf("take %d failed after %v: %v", i, took, err)
		if err == nil {
			t.Fatal("Take answered with Redis stopped")
		}
		if took > timeout+100*time.Millisecond {
			t.Errorf("take %d: failed after %v, want within %v and a small margin", i, took, timeout)
		}
	}
}

// TestRedisRefundManyAndRenew gives back leases of 150 keys in one
// RefundMany and renews one, on a standalone Redis, where the give-backs
// go 64 to a script call, on a Cluster, where the keys lie in different
// slots and go one to a call, and on shards, where each shard's keys go 64
// to a call on that shard: either way every unit is back.
func TestRedisRefundManyAndRenew(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	eachTopology(t, func(t *testing.T, client redis.UniversalClient) {
		// Preloaded: no NOSCRIPT retry in the count.
		r := newPreloadedRedis(t, client, p, Options{Zone: "many", Timeout: 5 * time.Second})
		const keys = 150
		backs := make([]limiter.Return, keys)
		for i := range backs {
			key := fmt.Sprint("k", i)
			d, err := r.TakeUpTo(ctx, key, 1, 10)
			if err != nil || d.Granted() != 10 {
				t.Fatalf("lease of %s: %+v, %v", key, d, err)
			}
			backs[i] = limiter.Return{Key: key, Units: 7, Taken: d.Receipt}
		}
		// The servers whose script calls are counted: the standalone
		// one, or each shard with the keys it holds.
		servers := map[*redis.Client]int64{}
		switch c := client.(type) {
		case *redis.Client:
			servers[c] = keys
		case *redis.Ring:
			for _, b := range backs {
				s, err := c.GetShardClientForKey(r.Key(b.Key))
				if err != nil {
					t.Fatal(err)
				}
				servers[s]++
			}
		}
		for c := range servers {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.ReturnMany(ctx, backs); err != nil {
			t.Fatal(err)
		}
		for c, n := range servers {
			calls, err := storetest.ScriptCalls(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if want := (n + redisMaxReturns - 1) / redisMaxReturns; calls != want {
				t.Errorf("%s: %d give-backs took %d script calls, want %d", c.Options().Addr, n, calls, want)
			}
		}
		for _, b := range backs {
			if d, err := r.Peek(ctx, b.Key); err != nil || d.Remaining != 97 {
				t.Fatalf("%s after the give-back: %+v, %v; want 97 left", b.Key, d, err)
			}
		}

		// A renewal gives back first, then leases from what that left.
		d, err := r.TakeUpTo(ctx, "k0", 1, 10)
		if err != nil || d.Remaining != 87 {
			t.Fatalf("lease: %+v, %v", d, err)
		}
		d, err = r.Renew(ctx, limiter.Return{Key: "k0", Units: 4, Taken: d.Receipt}, 1, 91)
		if err != nil || !d.Allowed || d.Granted() != 91 || d.Remaining != 0 {
			t.Fatalf("renewal: %+v, %v; want 91 granted, 87+4 being all that was left", d, err)
		}
	})
}

// TestRedisRefundManyRefuses: a cost outside the policy's range fails the
// whole call before anything is sent.
func TestRedisRefundManyRefuses(t *testing.T) {
	s := redistest.Start(t)
	r := newTestRedis(t, s.Client(t), limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}, Options{Zone: "refuse"})
	err := r.ReturnMany(context.Background(), []limiter.Return{{Key: "a", Units: 1}, {Key: "b", Units: 11}})
	if err == nil {
		t.Fatal("a refund of 11 units under a limit of 10 was accepted")
	}
	if _, err := r.Renew(context.Background(), limiter.Return{Key: "a", Units: 0}, 1, 2); err == nil {
		t.Fatal("a renewal giving back 0 units was accepted")
	}
}

// TestRedisClockStepsBack: when the clock steps back behind a key's state
// (Redis's own, or a failover to a server whose clock is behind), neither
// store readmits a quota it has already spent, and both decide alike: a
// window taken as its stored start, a bucket with no negative remaining.
func TestRedisClockStepsBack(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	for i, p := range []limiter.Policy{
		{Algorithm: limiter.FixedWindow, Events: 3, Window: time.Second},
		{Algorithm: limiter.SlidingWindowCounter, Events: 3, Window: time.Second},
		{Algorithm: limiter.SlidingWindowLog, Events: 3, Window: time.Second},
		{Algorithm: limiter.TokenBucket, Events: 3, Window: time.Second},
	} {
		t.Run(string(p.Algorithm), func(t *testing.T) {
			clock := &testutil.Clock{}
			mem, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			red := newTestRedis(t, client, p, Options{Zone: fmt.Sprintf("back%d", i), Timeout: 5 * time.Second, Clock: clock})
			const base = 1_763_800_010_500_000 // half a second into a window
			for step, at := range []int64{base, base, base, base - 600_000, base - 300_000} {
				clock.SetMicro(at)
				dm, errm := mem.Take(ctx, "k", 1)
				dr, errr := red.Take(ctx, "k", 1)
				if errm != nil || errr != nil {
					t.Fatalf("step %d: %v %v", step, errm, errr)
				}
				if dm.Allowed != dr.Allowed || dm.Remaining != dr.Remaining || dm.ResetAfter != dr.ResetAfter || dm.RetryAfter != dr.RetryAfter {
					t.Fatalf("step %d at %dus: memory %+v, redis %+v", step, at, dm, dr)
				}
				if step >= 3 && (dm.Allowed || dm.Remaining != 0) {
					t.Fatalf("step %d, the clock %dms behind: %+v, want refused with 0 remaining", step, (base-at)/1000, dm)
				}
			}
		})
	}
}

// instanceClients opens n Redis clients on addrs, one for each instance
// a test plays; the caller closes them (storetest.CloseClients).
func instanceClients(tb testing.TB, addrs []string, n int) []redis.UniversalClient {
	tb.Helper()
	return storetest.InstanceClients(tb, Config{Addresses: addrs}.NewClient, n)
}

package e2e

// Failover under load: steady traffic through a real Caddy while Redis
// changes master, by Sentinel (SENTINEL FAILOVER) or by Cluster (a master
// killed, its replica promoted). The zones fail open or local with a 50ms
// timeout, as in production, so what is checked is that the fail modes
// hold while the master changes and that decisions come back to Redis soon
// after the new master is promoted.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// failoverTimeout is the zones' decision timeout in these tests.
const failoverTimeout = 50 * time.Millisecond

// failoverResume bounds how long after the new master's promotion its
// first decision may come.
const failoverResume = 2 * time.Second

// failoverSite is a Caddyfile with two zones on one global key, one per
// fail mode that keeps serving (open: a Redis decision carries headers,
// a failure none; local: always headers, never an error), with limits no
// test reaches, and a plain route whose latency is the run's reference.
func failoverSite(redisBlock string) string {
	// A fixed window's key lives to the hour's end, so the test can find
	// the Cluster master that holds it.
	zone := "key global\nalgorithm fixed_window\nrate 1000000/1h\nfail "
	cfg := redisSite(redisBlock,
		redisRoute{path: "/open", zone: zone + "open"},
		redisRoute{path: "/local", zone: zone + "local"},
	)
	return strings.TrimSuffix(cfg, "}\n") + "\thandle /plain {\n\t\trespond \"plain\"\n\t}\n}\n"
}

// failoverPaths is each load worker's rotation: as many plain requests as
// zone requests, so the slowest plain request, the latency bound's margin,
// is the maximum of as many samples as the slowest zone request.
var failoverPaths = []string{"/open", "/plain", "/local", "/plain"}

// loadResult is one request of a load run.
type loadResult struct {
	path      string
	start     time.Time
	took      time.Duration
	code      int
	fromRedis bool // it carried rate-limit headers
	err       error
}

// loadRun sends requests from a few workers, each rotating over paths
// with a short pause, until stop is called; every request is recorded.
type loadRun struct {
	stopped chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []loadResult
}

// loadLimit bounds a load run however long the test waits.
const (
	loadMaxRequests = 100_000
	loadMaxTime     = time.Minute
)

func startLoad(t *testing.T, inst *caddyproc.Instance, workers int, paths ...string) *loadRun {
	t.Helper()
	run := &loadRun{stopped: make(chan struct{})}
	c := newClient(t)
	deadline := time.Now().Add(loadMaxTime)
	for w := range workers {
		run.wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-run.stopped:
					return
				default:
				}
				if time.Now().After(deadline) {
					return
				}
				path := paths[i%len(paths)]
				r, err := send(c, http.MethodGet, inst.URL(path))
				res := loadResult{path: path, start: r.start, took: r.took(), code: r.code, fromRedis: err == nil && r.hasRateLimitHeaders(), err: err}
				run.mu.Lock()
				run.results = append(run.results, res)
				full := len(run.results) >= loadMaxRequests
				run.mu.Unlock()
				if full {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	t.Cleanup(func() { run.stop() })
	return run
}

// stop ends the run and returns its requests.
func (run *loadRun) stop() []loadResult {
	select {
	case <-run.stopped:
	default:
		close(run.stopped)
	}
	run.wg.Wait()
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.results
}

// watchPromotion polls the replica every 5ms, up to limit, and returns
// when it first reported role:master and when it first ran a script for
// a client: the promotion, and the first decision made on the new master.
func watchPromotion(t *testing.T, replica *redistest.Server, limit time.Duration) (promoted, firstDecision time.Time) {
	t.Helper()
	c := replica.Client(t)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		repl, err1 := c.Info(ctx, "replication").Result()
		calls, err2 := evalCalls(ctx, c)
		cancel()
		now := time.Now()
		if promoted.IsZero() && err1 == nil && strings.Contains(repl, "role:master") {
			promoted = now
		}
		if !promoted.IsZero() && err2 == nil && calls > 0 {
			return promoted, now
		}
		time.Sleep(5 * time.Millisecond)
	}
	if promoted.IsZero() {
		t.Fatalf("the replica %s was not promoted within %v", replica.Addr(), limit)
	}
	t.Fatalf("the new master %s ran no script within %v of its promotion", replica.Addr(), limit)
	return
}

// checkFailoverRun checks a load run across a failover: every request
// answered 200 (the zones fail open or local and their limits are out of
// reach), no zone's request took longer than the timeout (×9/8, the tick
// rounding) plus 5ms plus the slowest plain request of the same run (what
// the loaded machine adds to any request), and the open zone decided in
// Redis again by the end. It logs the figures.
func checkFailoverRun(t *testing.T, what string, rs []loadResult, promoted, firstDecision time.Time) {
	t.Helper()
	var plainMax, zoneMax time.Duration
	var n, failed, errs int
	var lastFailure time.Time
	for _, r := range rs {
		switch {
		case r.err != nil:
			errs++
			if errs <= 5 {
				t.Errorf("%s: %s at %v: %v", what, r.path, r.start.Sub(promoted).Round(time.Millisecond), r.err)
			}
			continue
		case r.code != http.StatusOK:
			t.Errorf("%s: %s at %v: status %d, want 200", what, r.path, r.start.Sub(promoted).Round(time.Millisecond), r.code)
		}
		n++
		if r.path == "/plain" {
			plainMax = max(plainMax, r.took)
			continue
		}
		zoneMax = max(zoneMax, r.took)
		if r.path == "/open" && !r.fromRedis {
			failed++
			if r.start.After(lastFailure) {
				lastFailure = r.start
			}
		}
	}
	// A zone's request that times out waits on two goroutines the
	// runtime may run late on a busy machine, the timer that ends the
	// wait and the request's own, where a plain request waits on one:
	// hence twice the slowest plain request. A request held for a dial
	// or a breaker (a second) still fails it.
	bound := failoverTimeout*9/8 + 5*time.Millisecond + 2*plainMax
	last := "none"
	if failed > 0 {
		last = lastFailure.Sub(promoted).Round(time.Millisecond).String()
	}
	t.Logf("%s: %d requests (%d errors); /open failed open %d times, the last at %s after the promotion; first decision on the new master %v after its promotion; slowest zone request %v, slowest plain request %v (bound %v)",
		what, n, errs, failed, last, firstDecision.Sub(promoted).Round(time.Millisecond),
		zoneMax.Round(time.Millisecond), plainMax.Round(time.Millisecond), bound.Round(time.Millisecond))
	if zoneMax > bound {
		t.Errorf("%s: a zone's request took %v, want at most the timeout %v ×9/8 + 5ms + twice the slowest plain request %v = %v",
			what, zoneMax, failoverTimeout, plainMax, bound)
	}
	if d := firstDecision.Sub(promoted); d > failoverResume {
		t.Errorf("%s: first decision on the new master %v after its promotion, want within %v", what, d, failoverResume)
	}
}

// finishFailover lets the load run a second more on the new master, stops
// it, checks it (checkFailoverRun), and checks that decisions come from
// Redis at the end.
func finishFailover(t *testing.T, what string, inst *caddyproc.Instance, run *loadRun, promoted, first time.Time) {
	t.Helper()
	time.Sleep(time.Second)
	checkFailoverRun(t, what, run.stop(), promoted, first)
	c := newClient(t)
	testutil.Within(t, "decisions from Redis after the failover", 5*time.Second, func() error {
		return decided(get(t, c, inst.URL("/open")))
	})
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisSentinelFailoverUnderLoad: SENTINEL FAILOVER under steady
// traffic, with three Sentinels (quorum 2) named in the redis block.
func TestRedisSentinelFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinelQuorum(t, 3, 2)
	block := fmt.Sprintf("redis {\nmaster_name %s\naddresses %s\ntimeout %s\n}", s.MasterName, strings.Join(s.Addrs(), " "), failoverTimeout)
	inst := caddyproc.Start(t, failoverSite(block))
	c := newClient(t)
	testutil.Within(t, "a decision from Redis before the failover", 10*time.Second, func() error {
		return decided(get(t, c, inst.URL("/open")))
	})
	run := startLoad(t, inst, 3, failoverPaths...)
	time.Sleep(time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer sc.Close()
	if err := sc.Failover(ctx, s.MasterName).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	promoted, first := watchPromotion(t, s.Replica, 20*time.Second)
	// Every Sentinel names the new master.
	testutil.Within(t, "the Sentinels naming the new master", 20*time.Second, func() error {
		for _, addr := range s.Addrs() {
			c := redis.NewSentinelClient(&redis.Options{Addr: addr})
			got, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
			c.Close()
			if err != nil || len(got) != 2 || got[1] != strconv.Itoa(s.Replica.Port()) {
				return fmt.Errorf("sentinel %s names %v (%v), want port %d", addr, got, err, s.Replica.Port())
			}
		}
		return nil
	})
	finishFailover(t, "sentinel failover", inst, run, promoted, first)
}

// TestRedisClusterFailoverUnderLoad: the master holding the zones' key is
// killed under steady traffic; its replica takes over after the Cluster's
// node timeout.
func TestRedisClusterFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartClusterWithReplicas(t, 3)
	block := fmt.Sprintf("redis {\naddresses %s\ntimeout %s\n}", strings.Join(cluster.Addrs(), " "), failoverTimeout)
	inst := caddyproc.Start(t, failoverSite(block))
	c := newClient(t)
	testutil.Within(t, "a decision from Redis before the failover", 10*time.Second, func() error {
		if err := decided(get(t, c, inst.URL("/open"))); err != nil {
			return err
		}
		return decided(get(t, c, inst.URL("/local")))
	})
	// Both zones' keys hash the client key `global`, so they share a slot:
	// kill the master that holds it.
	victim := -1
	for i, m := range cluster.Masters {
		keys, err := m.Client(t).Keys(context.Background(), "floodgate:open:*").Result()
		if err != nil {
			t.Fatalf("KEYS on %s: %v", m.Addr(), err)
		}
		if len(keys) > 0 {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatal("no master holds the open zone's key")
	}
	run := startLoad(t, inst, 3, failoverPaths...)
	time.Sleep(time.Second)

	killed := time.Now()
	cluster.Masters[victim].Stop()
	promoted, first := watchPromotion(t, cluster.Replicas[victim], 20*time.Second)
	survivor := cluster.Masters[(victim+1)%len(cluster.Masters)].Client(t)
	testutil.Within(t, "cluster_state:ok after the failover", 10*time.Second, func() error {
		info, err := survivor.ClusterInfo(context.Background()).Result()
		if err == nil && !strings.Contains(info, "cluster_state:ok") {
			err = fmt.Errorf("CLUSTER INFO: %s", info)
		}
		return err
	})
	t.Logf("cluster: replica promoted %v after its master was killed (node timeout %v)",
		promoted.Sub(killed).Round(time.Millisecond), redistest.ClusterNodeTimeout)
	finishFailover(t, "cluster failover", inst, run, promoted, first)
}

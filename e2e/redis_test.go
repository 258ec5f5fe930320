package e2e

// End-to-end tests of `store redis`: real redis-server processes
// (internal/redistest) behind real Caddy processes (internal/caddyproc),
// so what is tested is what an operator runs: the Caddyfile's redis block,
// the shared client, the Lua scripts, the fail modes and reloads through the
// admin API.
//
// The machine these run on is small and shared, so:
//   - limits that must hold are set over minutes or hours, so a slow
//     request cannot refill them mid-test;
//   - zones that must decide in Redis use `fail closed` and a timeout of
//     seconds: an error shows as a 503 that fails the test, never as a
//     silent fail-open pass;
//   - real-time bounds (holds, pauses, restarts) are several times what the
//     operation should take.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// algorithmRoutes are the six algorithms, one path each, keyed by the
// X-Client header so each check has keys of its own. Every zone fails
// closed, so a Redis error shows as a 503 rather than an unlimited pass.
func algorithmRoutes(upstream string) []redisRoute {
	return []redisRoute{
		{path: "/tb", zone: "key header X-Client\nalgorithm token_bucket\nrate 5/m\nburst 3\nfail closed"},
		// One unit every 3s, two queued at most: the default max_delay,
		// (B-1)/r, is 3s.
		{path: "/lb", zone: "key header X-Client\nalgorithm leaky_bucket\nrate 1/3s\nburst 2\nfail closed"},
		{path: "/fw", zone: "key header X-Client\nalgorithm fixed_window\nevents 3\nwindow 1h\nfail closed"},
		{path: "/swl", zone: "key header X-Client\nalgorithm sliding_window_log\nevents 3\nwindow 1m\nfail closed"},
		{path: "/swc", zone: "key header X-Client\nalgorithm sliding_window_counter\nevents 3\nwindow 1h\nfail closed"},
		{path: "/cc", zone: "key header X-Client\nalgorithm concurrency\nevents 2\nwindow 1m\nfail closed", upstream: upstream},
	}
}

// startAlgorithmSite starts Caddy with algorithmRoutes over redisBlock and
// a gated upstream for the concurrency route.
func startAlgorithmSite(t *testing.T, redisBlock string) (*caddyproc.Instance, *upstream) {
	t.Helper()
	up := newUpstream(t, 0)
	up.hold()
	inst := caddyproc.Start(t, redisSite(redisBlock, algorithmRoutes(up.url)...))
	return inst, up
}

// checkAlgorithms runs every algorithm's allow and deny sequence, with its
// headers, through inst (started by startAlgorithmSite), each as a parallel
// subtest with client keys that start with prefix. It returns when all have
// finished. after, when set, runs at the end of each subtest with the
// zone's name, while the zone's state is still fresh (a leaky bucket's
// lives a few seconds).
func checkAlgorithms(t *testing.T, inst *caddyproc.Instance, up *upstream, prefix string, after func(t *testing.T, zone string)) {
	t.Helper()
	done := func(t *testing.T, zone string) {
		if after != nil {
			after(t, zone)
		}
	}
	t.Run("algorithms", func(t *testing.T) {
		for _, c := range []struct {
			name, zone, policy string
			// Retry-After of the refusal, and the reset after the third
			// request, in these bounds.
			retryLo, retryHi int64
			resetLo, resetHi time.Duration
		}{
			// q = B = 3, w = B/r = 3 / (5/60s) = 36s; one token comes back
			// every 12s; full again (B - tokens)/r = 36s after the third.
			{"token_bucket", "tb", `"tb";q=3;w=36`, 1, 12, 30 * time.Second, 37 * time.Second},
			// The oldest entry leaves a minute after it was made.
			{"sliding_window_log", "swl", `"swl";q=3;w=60`, 30, 60, 50 * time.Second, 61 * time.Second},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				defer done(t, c.zone)
				rs := threeThenRefused(t, inst, prefix, c.zone, c.policy)
				checkDenial(t, rs[3], c.zone, c.retryLo, c.retryHi)
				wantResetWithin(t, rs[2], c.resetLo, c.resetHi)
			})
		}
		t.Run("leaky_bucket", func(t *testing.T) {
			t.Parallel()
			defer done(t, "lb")
			c := newClient(t)
			url := inst.URL("/lb")
			first := get(t, c, url, clientHeader(prefix+"lb")...)
			if first.code != 200 {
				t.Fatalf("first request: %d, want 200", first.code)
			}
			// Two more at once: the queue holds one of them a slot (3s)
			// behind the first; the other would wait 6s, past max_delay.
			var rs [2]response
			var errs [2]error
			var wg sync.WaitGroup
			for i := range rs {
				wg.Go(func() { rs[i], errs[i] = send(c, http.MethodGet, url, clientHeader(prefix+"lb")...) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			held, refused := rs[0], rs[1]
			if held.code != 200 {
				held, refused = refused, held
			}
			if held.code != 200 || refused.code != 429 {
				t.Fatalf("concurrent requests: %d and %d, want one 200 and one 429", rs[0].code, rs[1].code)
			}
			checkPolicy(t, []response{first, held, refused}, "lb", `"lb";q=2;w=6`)
			// remaining counts free queue slots: one after the first.
			wantRemaining(t, "leaky_bucket", []response{first, held}, "lb", 1, 0)
			checkDenial(t, refused, "lb", 1, 3)
			// The held request's decision came at most (held.start -
			// first.start) plus its own latency after the first's, and it
			// was held 3s minus that gap; its latency is in took() too.
			minHold := 3*time.Second - held.start.Sub(first.start) - 100*time.Millisecond
			if held.took() < minHold || held.took() > 3*time.Second+10*time.Second {
				t.Errorf("held request took %v, want at least %v (the queue's spacing) and not far beyond 3s", held.took(), minHold)
			}
			t.Logf("leaky_bucket: held request took %v (first request took %v)", held.took(), first.took())
		})
		t.Run("fixed_window", func(t *testing.T) {
			t.Parallel()
			defer done(t, "fw")
			end := awayFromBoundary(t, time.Hour, 15*time.Second)
			rs := threeThenRefused(t, inst, prefix, "fw", `"fw";q=3;w=3600`)
			checkDenial(t, rs[3], "fw", 1, 3600)
			// Reset is the end of the aligned hour by Redis TIME.
			for i, r := range rs {
				if got := intHeader(t, r, "X-RateLimit-Reset"); got != end.Unix() && got != end.Unix()+1 {
					t.Errorf("response %d: X-RateLimit-Reset %d, want the hour's end %d", i+1, got, end.Unix())
				}
			}
		})
		t.Run("sliding_window_counter", func(t *testing.T) {
			t.Parallel()
			defer done(t, "swc")
			end := awayFromBoundary(t, time.Hour, 15*time.Second)
			rs := threeThenRefused(t, inst, prefix, "swc", `"swc";q=3;w=3600`)
			// The three units become the previous window at the hour's end
			// and weigh 3*(W-e)/W; est + 1 <= 3 once e >= W/3: twenty
			// minutes into the next hour.
			want := int64((end.Add(20*time.Minute).Sub(rs[3].done) + time.Second - 1) / time.Second)
			checkDenial(t, rs[3], "swc", want-3, want+3)
		})
		t.Run("concurrency", func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			url := inst.URL("/cc")
			var held [2]response
			var errs [2]error
			var wg sync.WaitGroup
			for i := range held {
				wg.Go(func() { held[i], errs[i] = send(c, http.MethodGet, url, clientHeader(prefix+"cc")...) })
			}
			up.waitArrivals(t, 2)
			refused := get(t, c, url, clientHeader(prefix+"cc")...)
			up.open()
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if held[0].code != 200 || held[1].code != 200 {
				t.Fatalf("held requests: %d and %d, want 200", held[0].code, held[1].code)
			}
			// Each saw the other's slot or not, by arrival: remaining 1
			// and 0 in some order.
			rems := []int64{intHeader(t, held[0], "X-RateLimit-Remaining"), intHeader(t, held[1], "X-RateLimit-Remaining")}
			slices.Sort(rems)
			if !slices.Equal(rems, []int64{0, 1}) {
				t.Errorf("held requests' remaining %v, want 0 and 1", rems)
			}
			checkDenial(t, refused, "cc", 1, 60)
			checkPolicy(t, []response{held[0], held[1], refused}, "cc", `"cc";q=2;w=60;qu="concurrent-requests"`)
			if p := up.peak.Load(); p != 2 {
				t.Errorf("upstream saw %d requests at once, want 2", p)
			}
			// Both slots came back when the held requests finished.
			after := get(t, c, url, clientHeader(prefix+"cc")...)
			if after.code != 200 {
				t.Fatalf("after the held requests finished: %d, want 200", after.code)
			}
			wantRemaining(t, "concurrency after release", []response{after}, "cc", 1)
		})
	})
}

// threeThenRefused sends four requests of one client to zone's path, a
// zone that admits three: 200, 200, 200 then 429, remaining 2, 1, 0, 0,
// and every response with the policy member want.
func threeThenRefused(t *testing.T, inst *caddyproc.Instance, prefix, zone, want string) []response {
	t.Helper()
	rs := sequence(t, newClient(t), 4, inst.URL("/"+zone), clientHeader(prefix+zone)...)
	wantCodes(t, zone, rs, 200, 200, 200, 429)
	wantRemaining(t, zone, rs, zone, 2, 1, 0, 0)
	checkPolicy(t, rs, zone, want)
	return rs
}

// TestRedisAlgorithms runs every algorithm through the handler with `store
// redis` on a standalone server, and checks that the state is in Redis.
func TestRedisAlgorithms(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	inst, up := startAlgorithmSite(t, redisURLBlock(srv.Addr(), redisTimeout))
	// Every algorithm wrote its state to Redis under the default prefix,
	// checked as each finishes, while its state still lives.
	client := srv.Client(t)
	checkAlgorithms(t, inst, up, "standalone-", func(t *testing.T, zone string) {
		keys, err := client.Keys(context.Background(), "floodgate:"+zone+":{*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Errorf("no key of zone %s in Redis", zone)
		}
	})
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisAccuracyAcrossInstances: three Caddy processes share one Redis
// and one key (`key global`). 600 requests at once, spread evenly, against
// 100 per hour admit exactly 100, and a concurrency zone never lets more
// than its limit reach the upstream at once. It runs on a Redis that
// decides by its own TIME, and again on one that refuses TIME in scripts
// (as AWS ElastiCache Serverless does), where each instance finds that out
// when it loads its scripts and sends its own clock: on one machine the
// instances share a clock, so the counts are as exact.
func TestRedisAccuracyAcrossInstances(t *testing.T) {
	t.Parallel()
	t.Run("redis clock", func(t *testing.T) { redisAccuracyAcrossInstances(t, redistest.Start(t), "redis") })
	t.Run("instance clock", func(t *testing.T) {
		redisAccuracyAcrossInstances(t, redistest.StartArgs(t, redistest.WithoutTime...), "instance")
	})
}

// redisAccuracyAcrossInstances is TestRedisAccuracyAcrossInstances on srv,
// whose zones the admin API and the metrics must say decide by clock.
func redisAccuracyAcrossInstances(t *testing.T, srv *redistest.Server, clock string) {
	up := newUpstream(t, 50*time.Millisecond)
	block := redisURLBlock(srv.Addr(), redisTimeout)
	cfg := redisSite(block,
		redisRoute{path: "/tb", zone: "key global\nalgorithm token_bucket\nrate 100/1h\nfail closed"},
		redisRoute{path: "/fw", zone: "key global\nalgorithm fixed_window\nrate 100/1h\nfail closed"},
		redisRoute{path: "/swl", zone: "key global\nalgorithm sliding_window_log\nrate 100/1h\nfail closed"},
		redisRoute{path: "/swc", zone: "key global\nalgorithm sliding_window_counter\nrate 100/1h\nfail closed"},
		redisRoute{path: "/cc", zone: "key global\nalgorithm concurrency\nevents 5\nwindow 1m\nfail closed", upstream: up.url},
	)
	insts := []*caddyproc.Instance{caddyproc.Start(t, cfg), caddyproc.Start(t, cfg), caddyproc.Start(t, cfg)}
	c := newClient(t)
	defer func() {
		if t.Failed() {
			for i, inst := range insts {
				t.Logf("caddy %d log:\n%s", i, inst.Log())
			}
		}
	}()
	urls := func(path string) []string {
		out := make([]string, len(insts))
		for i, inst := range insts {
			out[i] = inst.URL(path)
		}
		return out
	}

	const n, limit = 600, 100
	for _, alg := range []struct{ name, path string }{
		{"token_bucket", "/tb"},
		{"fixed_window", "/fw"},
		{"sliding_window_log", "/swl"},
		// The counter's estimate is prev*(W-e)/W + cur. This key is new,
		// so prev is 0 whatever e is, the estimate is cur exactly, and the
		// zone admits iff cur + 1 <= L: exactly L, like fixed_window. Its
		// documented error (the previous window's requests assumed evenly
		// spread) needs a non-empty previous window, which a burst inside
		// one hour (the test avoids the hour's last seconds) never has.
		{"sliding_window_counter", "/swc"},
	} {
		awayFromBoundary(t, time.Hour, 30*time.Second)
		res := burst(c, urls(alg.path), n)
		t.Logf("%s: %d requests over 3 instances in %v: %d admitted (per instance %v), %d refused",
			alg.name, n, res.elapsed.Round(time.Millisecond), res.ok, res.okPerServer, res.denied)
		res.wantAnswered(t, alg.name)
		want := limit
		if alg.name == "token_bucket" {
			// A token comes back every 36s; a burst that took longer
			// (never seen, but the machine is shared) earned more.
			want += int(res.elapsed / (36 * time.Second))
		}
		if res.ok != want || res.denied != n-res.ok-len(res.errs)-len(res.other) {
			t.Errorf("%s: %d admitted, %d refused; want exactly %d admitted", alg.name, res.ok, res.denied, want)
		}
	}

	// Concurrency: 30 clients (ten per instance) request in a loop for 2s
	// against L = 5 over an upstream that holds each request 50ms.
	const workers, runFor, lim = 30, 2 * time.Second, 5
	var admitted, refused atomic.Int64
	var mu sync.Mutex
	var bad []string
	ccURLs := urls("/cc")
	stop := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				r, err := send(c, http.MethodGet, ccURLs[w%len(ccURLs)], clientHeader("")...)
				switch {
				case err != nil:
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
				case r.code == http.StatusOK:
					admitted.Add(1)
				case r.code == http.StatusTooManyRequests:
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					mu.Lock()
					bad = append(bad, strconv.Itoa(r.code))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	t.Logf("concurrency: %d admitted, %d refused in %v by %d clients over 3 instances; most in flight at the upstream: %d (limit %d)",
		admitted.Load(), refused.Load(), runFor, workers, up.peak.Load(), lim)
	if len(bad) > 0 {
		t.Errorf("concurrency: %d requests neither 200 nor 429: %v", len(bad), bad[:min(len(bad), 10)])
	}
	if p := up.peak.Load(); p > lim {
		t.Errorf("concurrency: %d requests in flight at the upstream at once, limit %d", p, lim)
	}
	if admitted.Load() < lim {
		t.Errorf("concurrency: only %d requests admitted, want at least the limit %d", admitted.Load(), lim)
	}
	// Every slot was given back: a new request sees L-1 remaining.
	final := get(t, c, insts[0].URL("/cc"), clientHeader("")...)
	if final.code != 200 {
		t.Fatalf("concurrency after the run: %d, want 200", final.code)
	}
	wantRemaining(t, "concurrency after the run", []response{final}, "cc", lim-1)

	// Each instance says which clock its zones decide by, in the zones
	// API and the metrics, and logs a switch to its own clock once.
	for i, inst := range insts {
		var zones []map[string]any
		adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &zones)
		for _, z := range zones {
			if z["clock"] != clock {
				t.Errorf("instance %d: zones API: zone %v decides by clock %v, want %q", i, z["zone"], z["clock"], clock)
			}
		}
		wantGauge := map[string]string{"redis": "0", "instance": "1"}[clock]
		if got := rateLimitSeries(t, c, inst)[`caddy_http_rate_limit_instance_clock{zone="tb"}`]; got != wantGauge {
			t.Errorf("instance %d: caddy_http_rate_limit_instance_clock{zone=\"tb\"} %q, want %q", i, got, wantGauge)
		}
		wantWarnings := map[string]int{"redis": 0, "instance": 1}[clock]
		if n := strings.Count(inst.Log(), "refuses TIME inside scripts"); n != wantWarnings {
			t.Errorf("instance %d logged the switch to its own clock %d times, want %d", i, n, wantWarnings)
		}
	}
}

// TestRedisCluster runs every algorithm through the handler against a real
// three-master Cluster named by `addresses`, then checks that the keys of
// different clients spread over the masters.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	block := fmt.Sprintf("redis {\naddresses %s\ntimeout %s\n}", strings.Join(cluster.Addrs(), " "), redisTimeout)
	inst, up := startAlgorithmSite(t, block)
	checkAlgorithms(t, inst, up, "cluster-", nil)
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
		return
	}

	// Thirty more clients, one request each on the fixed window.
	c := newClient(t)
	for i := range 30 {
		r := get(t, c, inst.URL("/fw"), clientHeader(fmt.Sprintf("spread-%d", i))...)
		if r.code != 200 || !r.hasRateLimitHeaders() {
			t.Fatalf("client %d: %d %v, want 200 with headers", i, r.code, r.header)
		}
	}
	ctx := context.Background()
	cc := cluster.Client(t)
	slots := map[int64]bool{}
	var sizes []int64
	for _, m := range cluster.Masters {
		node := m.Client(t)
		keys, err := node.Keys(ctx, "floodgate:*").Result()
		if err != nil {
			t.Fatalf("KEYS on %s: %v", m.Addr(), err)
		}
		for _, k := range keys {
			slot, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
			}
			slots[slot] = true
		}
		sizes = append(sizes, redisDBSize(t, m))
	}
	t.Logf("cluster: keys per master %v in %d distinct slots", sizes, len(slots))
	for i, n := range sizes {
		if n == 0 {
			t.Errorf("master %d (%s) holds no keys: clients' keys do not spread (%v)", i, cluster.Masters[i].Addr(), sizes)
		}
	}
	if len(slots) < 10 {
		t.Errorf("keys of 35 clients fall in only %d slots", len(slots))
	}
}

// TestRedisSentinel runs every algorithm through the handler with
// `master_name` and the Sentinel's address, and checks that the state is on
// the master the Sentinel names. The Sentinel requires a password of its
// own (sentinel_password); the data nodes require none.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinelAuth(t, "sentinel-secret")
	block := fmt.Sprintf("redis {\nmaster_name %s\naddresses %s\nsentinel_password %s\ntimeout %s\n}", s.MasterName, s.Addr(), s.Password, redisTimeout)
	inst, up := startAlgorithmSite(t, block)
	checkAlgorithms(t, inst, up, "sentinel-", nil)
	if n := redisDBSize(t, s.Master); n == 0 {
		t.Errorf("the master holds no keys")
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// failRoutes are three zones that differ only in their fail mode, each an
// exact sliding window of 3 per hour on one shared key.
func failRoutes() []redisRoute {
	zone := "key global\nalgorithm sliding_window_log\nevents 3\nwindow 1h\nfail "
	return []redisRoute{
		{path: "/open", zone: zone + "open"},
		{path: "/closed", zone: zone + "closed"},
		{path: "/local", zone: zone + "local"},
	}
}

// TestRedisKilled: Redis dies under two running instances. `fail open`
// passes everything without that zone's headers, `fail closed` answers 503
// with Retry-After: 1, and `fail local` goes on limiting, with a fresh
// in-memory limit on each instance.
func TestRedisKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := redisSite(redisURLBlock(srv.Addr(), redisTimeout), failRoutes()...)
	a, b := caddyproc.Start(t, cfg), caddyproc.Start(t, cfg)
	c := newClient(t)

	// While Redis runs, the two instances share each zone's limit.
	for _, path := range []string{"/open", "/closed", "/local"} {
		zone := strings.TrimPrefix(path, "/")
		rs := []response{get(t, c, a.URL(path), clientHeader("")...), get(t, c, b.URL(path), clientHeader("")...)}
		wantCodes(t, "before the kill "+path, rs, 200, 200)
		wantRemaining(t, "before the kill "+path, rs, zone, 2, 1)
	}

	srv.Stop()
	killed := time.Now()

	// A refused connection is an error at once: the fail mode must apply
	// then, not after most of the 2s timeout has gone on redialing.
	var slowest time.Duration
	failFast := func(rs []response) {
		t.Helper()
		for i, r := range rs {
			slowest = max(slowest, r.took())
			if r.took() > time.Second {
				t.Errorf("response %d took %v with Redis down, want the fail mode well within the 2s timeout", i+1, r.took())
			}
		}
	}
	for _, inst := range []*caddyproc.Instance{a, b} {
		rs := sequence(t, c, 5, inst.URL("/open"), clientHeader("")...)
		failFast(rs)
		wantCodes(t, "fail open", rs, 200, 200, 200, 200, 200)
		for i, r := range rs {
			if r.hasRateLimitHeaders() {
				t.Errorf("fail open: response %d has rate-limit headers: %v", i+1, r.header)
			}
		}

		rs = sequence(t, c, 3, inst.URL("/closed"), clientHeader("")...)
		failFast(rs)
		wantCodes(t, "fail closed", rs, 503, 503, 503)
		for i, r := range rs {
			if got := r.header.Get("Retry-After"); got != "1" {
				t.Errorf("fail closed: response %d: Retry-After %q, want 1", i+1, got)
			}
		}

		// Redis had one unit left of the shared three; each instance's
		// local limit starts empty and allows three on its own.
		rs = sequence(t, c, 4, inst.URL("/local"), clientHeader("")...)
		failFast(rs)
		wantCodes(t, "fail local", rs, 200, 200, 200, 429)
		wantRemaining(t, "fail local", rs, "local", 2, 1, 0, 0)
		checkDenial(t, rs[3], "local", 3000, 3600)
	}
	t.Logf("after the kill: 24 requests answered in %v, the slowest in %v",
		time.Since(killed).Round(time.Millisecond), slowest.Round(time.Millisecond))
	if t.Failed() {
		t.Logf("caddy log:\n%s", a.Log())
	}
}

// TestRedisPaused: a Redis that accepts connections but never answers
// (SIGSTOP) costs each request no more than the 50ms timeout plus a little,
// and decisions resume once it continues.
func TestRedisPaused(t *testing.T) {
	t.Parallel()
	zone := "key global\nalgorithm token_bucket\nrate 1000/1h\nfail "
	srv, inst := startRedisSite(t, "50ms",
		redisRoute{path: "/open", zone: zone + "open"},
		redisRoute{path: "/closed", zone: zone + "closed"},
	)
	c := newClient(t)
	url := inst.URL("/open")

	// 50ms is tight on a loaded machine: wait for a decision from Redis.
	testutil.Within(t, "a decision from Redis before the pause", 10*time.Second, func() error {
		return decided(get(t, c, url))
	})

	srv.Pause()
	var worst time.Duration
	check := func(what string, r response, limit time.Duration) {
		t.Helper()
		worst = max(worst, r.took())
		if r.took() > limit {
			t.Errorf("%s: took %v while Redis was paused, want under %v", what, r.took(), limit)
		}
	}
	for i := range 10 {
		r := get(t, c, inst.URL("/open"), clientHeader("")...)
		check("fail open", r, time.Second)
		if r.code != 200 || r.hasRateLimitHeaders() {
			t.Errorf("fail open, request %d: %d %v, want 200 without rate-limit headers", i+1, r.code, r.header)
		}
		r = get(t, c, inst.URL("/closed"), clientHeader("")...)
		check("fail closed", r, time.Second)
		if r.code != 503 || r.header.Get("Retry-After") != "1" {
			t.Errorf("fail closed, request %d: %d, Retry-After %q; want 503 with Retry-After 1", i+1, r.code, r.header.Get("Retry-After"))
		}
	}
	sequential := worst
	// Twenty at once, each needing its own connection to the stalled
	// server: the deadline bounds the dial and the wait alike. The bound
	// is looser only because twenty requests share two loaded cores.
	rs := burst(c, []string{inst.URL("/open"), inst.URL("/closed")}, 20)
	if len(rs.errs) > 0 || rs.ok != 10 || len(rs.other) != 10 || rs.elapsed > 2*time.Second {
		t.Errorf("20 concurrent requests while paused: %d ok, other %v, errors %v, in %v; want 10 200s and 10 503s within 2s",
			rs.ok, rs.other, rs.errs, rs.elapsed)
	}
	srv.Resume()
	took := testutil.Within(t, "a decision from Redis after the pause", 10*time.Second, func() error {
		return decided(get(t, c, url))
	})
	t.Logf("paused Redis, 50ms timeout: slowest of 20 sequential requests %v, 20 concurrent requests in %v; decisions back %v after SIGCONT",
		sequential.Round(time.Millisecond), rs.elapsed.Round(time.Millisecond), took.Round(time.Millisecond))
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisRestarted: after a restart without persistence (keys and the
// script cache gone), decisions come from Redis again within a second, the
// scripts reloaded on NOSCRIPT, with the counters starting afresh.
func TestRedisRestarted(t *testing.T) {
	t.Parallel()
	srv, inst := startRedisSite(t, redisTimeout, failRoutes()[:2]...)
	c := newClient(t)
	rs := sequence(t, c, 4, inst.URL("/closed"), clientHeader("")...)
	wantCodes(t, "before the restart", rs, 200, 200, 200, 429)
	// The refusal is repeated from memory for the denial cache's second;
	// past it, the next request asks Redis.
	time.Sleep(denyCacheDefault)

	began := time.Now()
	srv.Restart()
	up := time.Now()
	var first response
	took := testutil.Within(t, "a decision from Redis after the restart", 5*time.Second, func() error {
		first = get(t, c, inst.URL("/closed"))
		return decidedClosed(first)
	})
	t.Logf("restart: server answered PING %v after it was stopped; first decision from Redis %v after that",
		up.Sub(began).Round(time.Millisecond), took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("decisions resumed %v after the restart, want within a second", took)
	}
	// Fresh counters: the first decision was the first of three.
	wantCodes(t, "after the restart", []response{first}, 200)
	wantRemaining(t, "after the restart", []response{first}, "closed", 2)
	r := get(t, c, inst.URL("/open"), clientHeader("")...)
	if r.code != 200 || !r.hasRateLimitHeaders() {
		t.Errorf("fail open zone after the restart: %d %v, want a decision from Redis", r.code, r.header)
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisUnreachableAtStartup: Caddy starts although Redis is down; the
// fail modes apply until Redis comes up on its address, and decisions come
// from Redis from then on.
func TestRedisUnreachableAtStartup(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Stop() // keep its port and directory for the start below
	release := holdPort(t, srv.Port())
	inst := caddyproc.Start(t, redisSite(redisURLBlock(srv.Addr(), redisTimeout), failRoutes()...))
	c := newClient(t)

	r := get(t, c, inst.URL("/open"), clientHeader("")...)
	if r.code != 200 || r.hasRateLimitHeaders() {
		t.Errorf("fail open without Redis: %d %v, want 200 without rate-limit headers", r.code, r.header)
	}
	r = get(t, c, inst.URL("/closed"), clientHeader("")...)
	if r.code != 503 || r.header.Get("Retry-After") != "1" {
		t.Errorf("fail closed without Redis: %d, Retry-After %q; want 503 with 1", r.code, r.header.Get("Retry-After"))
	}
	rs := sequence(t, c, 4, inst.URL("/local"), clientHeader("")...)
	wantCodes(t, "fail local without Redis", rs, 200, 200, 200, 429)

	release()
	srv.Restart()
	var first response
	took := testutil.Within(t, "a decision from Redis once it runs", 10*time.Second, func() error {
		first = get(t, c, inst.URL("/closed"))
		return decidedClosed(first)
	})
	t.Logf("unreachable at startup: first decision from Redis %v after it came up", took.Round(time.Millisecond))
	wantCodes(t, "fail closed once Redis runs", []response{first}, 200)
	wantRemaining(t, "fail closed once Redis runs", []response{first}, "closed", 2)
	// The local zone now decides in Redis, where its key is new.
	rs = sequence(t, c, 1, inst.URL("/local"), clientHeader("")...)
	wantCodes(t, "fail local once Redis runs", rs, 200)
	wantRemaining(t, "fail local once Redis runs", rs, "local", 2)
	if n := redisDBSize(t, srv); n < 2 {
		t.Errorf("Redis holds %d keys, want the closed and local zones' keys", n)
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// holdPort binds 127.0.0.1:port without listening, until release is called
// (or the test ends). Connections to it are refused, as to a Redis that is
// down, yet no other process can take the port meanwhile: outgoing
// connections of parallel tests draw their local ports from the same
// ephemeral range, and one could otherwise sit on it when Redis restarts.
func holdPort(t *testing.T, port int) (release func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	// SO_REUSEADDR: the stopped server's closed connections may linger in
	// TIME_WAIT on the port.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		t.Fatalf("SO_REUSEADDR: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		t.Fatalf("holding port %d: %v", port, err)
	}
	var once sync.Once
	release = func() { once.Do(func() { syscall.Close(fd) }) }
	t.Cleanup(release)
	return release
}

// TestRedisBadConfigRefused: a broken redis block, or `store redis`
// without one, is refused by the admin API with the Caddyfile line, and the
// running config keeps serving from Redis.
func TestRedisBadConfigRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	good := configRedisSite(srv.Addr(), "v1")
	inst := caddyproc.Start(t, good)
	c := newClient(t)
	url := inst.URL("/")
	wantRemaining(t, "before", sequence(t, c, 1, url, clientHeader("cfg")...), "cfg", 2)

	redisLine := lineOf(t, good, "redis {")
	blockEnd := redisLine + 3 // the redis block's closing brace
	lines := strings.Split(good, "\n")
	noBlock := strings.Join(append(slices.Clone(lines[:redisLine-1]), lines[blockEnd:]...), "\n")
	for _, tc := range []struct {
		name, cfg, at string
		// want is more text the error must hold.
		want string
	}{
		{"unparseable url", strings.Replace(good, "url redis://"+srv.Addr(), "url redis://127.0.0.1:notaport", 1), "url redis://", "url"},
		{"unknown option", strings.Replace(good, "timeout "+redisTimeout, "timeout "+redisTimeout+"\n\t\t\tflavour cherry", 1), "flavour", "flavour"},
		// Found once the whole directive is read; reported at the zone.
		{"store redis without a redis block", noBlock, "zone cfg", "zone cfg: "},
	} {
		err := inst.Load(tc.cfg)
		if err == nil {
			t.Errorf("%s: Load accepted:\n%s", tc.name, tc.cfg)
			continue
		}
		line := lineOf(t, tc.cfg, tc.at)
		if want := fmt.Sprintf("Caddyfile:%d", line); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error does not name %s (the line with %q): %v", tc.name, want, tc.at, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error does not mention %q: %v", tc.name, tc.want, err)
		}
	}
	rs := sequence(t, c, 3, url, clientHeader("cfg")...)
	wantCodes(t, "the old config after refused loads", rs, 200, 200, 429)
	wantRemaining(t, "the old config after refused loads", rs, "cfg", 1, 0, 0)
	if rs[0].body != "v1" {
		t.Errorf("body %q, want the old config's v1", rs[0].body)
	}
}

// TestRedisReload: a reload through the admin API that keeps the redis
// block keeps the client (its connections stay open) and the counters; one
// that changes the block moves the zone to the new server and closes the
// old client.
func TestRedisReload(t *testing.T) {
	t.Parallel()
	one, two := redistest.Start(t), redistest.Start(t)
	inst := caddyproc.Start(t, configRedisSite(one.Addr(), "v1"))
	c := newClient(t)
	url := inst.URL("/")
	wantRemaining(t, "before the reload", sequence(t, c, 2, url, clientHeader("k")...), "cfg", 2, 1)
	before := caddyConnIDs(t, one)
	if len(before) == 0 {
		t.Fatalf("no connection named floodgate-caddy on the server")
	}

	if err := inst.Load(configRedisSite(one.Addr(), "v2")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	rs := sequence(t, c, 2, url, clientHeader("k")...)
	wantCodes(t, "after a reload keeping the block", rs, 200, 429)
	if rs[0].body != "v2" {
		t.Fatalf("body %q: the reload did not take effect", rs[0].body)
	}
	wantRemaining(t, "after a reload keeping the block", rs, "cfg", 0, 0)
	after := caddyConnIDs(t, one)
	for _, id := range before {
		if !slices.Contains(after, id) {
			t.Errorf("connection %s closed by a reload that kept the redis block (before %v, after %v): the client was not kept", id, before, after)
		}
	}
	t.Logf("reload keeping the block: Caddy's connections %v before, %v after", before, after)

	if err := inst.Load(configRedisSite(two.Addr(), "v3")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	rs = sequence(t, c, 1, url, clientHeader("k")...)
	wantCodes(t, "after switching servers", rs, 200)
	wantRemaining(t, "after switching servers", rs, "cfg", 2)
	if n := redisDBSize(t, two); n != 1 {
		t.Errorf("the new server holds %d keys, want the zone's one", n)
	}
	testutil.Within(t, "the old client's connections closed", 10*time.Second, func() error {
		if ids := caddyConnIDs(t, one); len(ids) > 0 {
			return fmt.Errorf("connections %v open", ids)
		}
		return nil
	})
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisSeveralZones: a request matching three Redis zones, through
// Caddy. They are decided together; when the first refuses, what the
// other two took is given back, so they report only admitted requests.
func TestRedisSeveralZones(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	zone := func(name, extra string) string {
		return "zone " + name + " {\n" + extra + "key header X-Client\nstore redis\n}\n"
	}
	inst := caddyproc.Start(t, globalsWith("")+"\nhttp://{{http}} {\nrate_limit {\n"+
		zone("several_a", "match {\npath /limited\n}\nalgorithm token_bucket\nrate 2/1h\n")+
		zone("several_b", "algorithm sliding_window_log\nrate 100/1h\n")+
		zone("several_c", "algorithm token_bucket\nrate 100/1h\n")+
		redisURLBlock(srv.Addr(), redisTimeout)+"\n}\nrespond \"ok\"\n}\n")
	c := newClient(t)
	rs := sequence(t, c, 4, inst.URL("/limited"), clientHeader("several")...)
	wantCodes(t, "three zones", rs, 200, 200, 429, 429)
	for _, z := range []string{"several_b", "several_c"} {
		if r := intParam(t, zoneParams(t, rs[1], "RateLimit", z), "r"); r != 98 {
			t.Errorf("second request: %s r=%d, want 98", z, r)
		}
	}
	if got := rs[3].header.Get("RateLimit"); got != `"several_a";r=0;t=`+rs[3].header.Get("Retry-After") {
		t.Errorf("refusal's RateLimit %q: want the refusing zone alone", got)
	}
	open := get(t, c, inst.URL("/open"), clientHeader("several")...)
	if open.code != 200 {
		t.Fatalf("/open: %d", open.code)
	}
	for _, z := range []string{"several_b", "several_c"} {
		if r := intParam(t, zoneParams(t, open, "RateLimit", z), "r"); r != 97 {
			t.Errorf("after 2 admitted, 2 refused and 1 more: %s r=%d, want 97", z, r)
		}
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestRedisConfigErrorsNamedAtProvision: a redis block that Redis refuses
// for its configuration (a wrong password, none where one is required, a
// single address that is a Cluster node) is logged once, as an error
// naming the fix, when the config loads; its zones then fail as for any
// store failure: `fail closed` answers 503, and the breaker opens (the
// zones API says store_up false).
func TestRedisConfigErrorsNamedAtProvision(t *testing.T) {
	t.Parallel()
	authed := redistest.StartArgs(t, "--requirepass", "sekret")
	cluster := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		name, redis, hint string
		// breaker: every decision fails, so the breaker opens (a Cluster
		// node answers the keys of its own slots, which closes it again).
		breaker bool
	}{
		{"wrong password", "url redis://" + authed.Addr() + "\npassword wrong", "redis rejected the password: check the redis block's password/username", true},
		{"no password", "url redis://" + authed.Addr(), "redis requires a password and none was given: set the redis block's password (and username)", true},
		{"cluster node", "addresses " + cluster.Masters[0].Addr(), "is a Redis Cluster node", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var redisLines strings.Builder
			for _, l := range strings.Split(tc.redis, "\n") {
				redisLines.WriteString("\t\t\t" + l + "\n")
			}
			inst := caddyproc.Start(t, globalsWith("")+`
http://{{http}} {
	rate_limit {
		zone cfg {
			key {header.X-Client}
			rate 100/1h
			store redis
			fail closed
		}
		redis {
`+redisLines.String()+`			timeout 500ms
			breaker_after 1ms
			breaker_open_for 1m
		}
	}
	respond "ok"
}
`)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("caddy log:\n%s", inst.Log())
				}
			})
			c := newClient(t)
			if tc.breaker {
				for i := range 3 {
					wantCodes(t, "request "+strconv.Itoa(i+1), sequence(t, c, 1, inst.URL("/"), "X-Client", "k"), 503)
					time.Sleep(5 * time.Millisecond)
				}
				var zones []map[string]any
				adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &zones)
				if len(zones) != 1 || zones[0]["store_up"] != false {
					t.Errorf("zones after three failures %v apart: %v, want store_up false (the breaker open)", 5*time.Millisecond, zones)
				}
			} else {
				// Some key of a slot the node does not serve: MOVED.
				codes := map[int]int{}
				for i := range 20 {
					codes[get(t, c, inst.URL("/"), "X-Client", "k"+strconv.Itoa(i)).code]++
				}
				if codes[503] == 0 {
					t.Errorf("20 keys on one Cluster node: statuses %v, want some 503 (MOVED fails closed)", codes)
				}
			}
			log := inst.Log()
			if n := strings.Count(log, tc.hint); n != 1 {
				t.Errorf("the log names the fix (%q) %d times, want once", tc.hint, n)
			}
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, tc.hint) && !strings.Contains(line, `"level":"error"`) {
					t.Errorf("logged, but not as an error: %s", line)
				}
			}
		})
	}
}

package e2e

// End-to-end tests of what keeps a redis zone's decisions in memory on each
// instance, local_quota leases and the denial cache, through real Caddy
// processes on a real redis-server.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// takenInRedis is how many units of a `key global` zone's limit Redis
// counts as taken now: admitted by some instance, or held in a lease. It
// asks observer (see startObserver) for the key's state, which consumes
// nothing.
func takenInRedis(t *testing.T, observer *caddyproc.Instance, zone string) int64 {
	t.Helper()
	var st keyReport
	if code := adminCall(t, observer, http.MethodGet, "/rate_limit/zones/"+url.PathEscape(zone)+"?key=global", &st); code != http.StatusOK {
		t.Fatalf("inspect %s global: %d %+v", zone, code, st)
	}
	return st.Limit - st.Remaining
}

// TestLeasesAccuracyAcrossInstances: three Caddy processes on one Redis,
// one key, 100 per hour with local_quota 0.2. 600 requests at once, spread
// over the three, admit at most 100; once the leases are back in Redis (2 s
// at most: a lease lives a second), a second wave of 300 brings the total
// to exactly 100. A first wave of 60 admits 60 and leaves units in every
// lease, which only their give-back returns. The counter's key is new, so
// its estimate is exact here (see TestRedisAccuracyAcrossInstances).
func TestLeasesAccuracyAcrossInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	algs := []string{"token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"}
	waves := []int{600, 60}
	var routes []redisRoute
	for _, alg := range algs {
		for _, n := range waves {
			routes = append(routes, redisRoute{path: fmt.Sprintf("/%s_%d", alg, n), zone: "key global\nalgorithm " + alg + "\nrate 100/1h\nlocal_quota 0.2\nfail closed"})
		}
	}
	cfg := redisSite(redisURLBlock(srv.Addr(), redisTimeout), routes...)
	insts := []*caddyproc.Instance{caddyproc.Start(t, cfg), caddyproc.Start(t, cfg), caddyproc.Start(t, cfg)}
	observer := startObserver(t, cfg)
	c := newClient(t)
	defer func() {
		if t.Failed() {
			for i, inst := range insts {
				t.Logf("caddy %d log:\n%s", i, inst.Log())
			}
		}
	}()
	for _, alg := range algs {
		for _, n := range waves {
			checkLeaseWaves(t, c, insts, observer, alg, n)
		}
	}
}

// checkLeaseWaves sends a first wave of n requests and then, once the
// leases are back in Redis, a second of 300, and checks what they admit.
func checkLeaseWaves(t *testing.T, c *http.Client, insts []*caddyproc.Instance, observer *caddyproc.Instance, alg string, n int) {
	t.Helper()
	const limit = 100
	zone := fmt.Sprintf("%s_%d", alg, n)
	var urls []string
	for _, inst := range insts {
		urls = append(urls, inst.URL("/"+zone))
	}
	awayFromBoundary(t, time.Hour, 30*time.Second)
	first := burst(c, urls, n)
	if len(first.errs) > 0 || len(first.other) > 0 || first.ok > min(limit, n) || (n < limit && first.ok != n) {
		t.Errorf("%s, first wave of %d: %d admitted, errors %v, other statuses %v; want at most %d and only 200 or 429",
			zone, n, first.ok, firstErr(first.errs), first.other, min(limit, n))
	}
	// Wait for the leases to lapse and go back, reading Redis, then for
	// the refusals cached with them to lapse too.
	start := time.Now()
	testutil.Eventually(t, zone+": leases given back to Redis", func() error {
		if taken := takenInRedis(t, observer, zone); taken != int64(first.ok) {
			return fmt.Errorf("%d units taken in Redis, %d admitted", taken, first.ok)
		}
		return nil
	})
	back := time.Since(start)
	if back > 2*time.Second {
		t.Errorf("%s: leases back in Redis %v after the first wave, want within 2s", zone, back)
	}
	time.Sleep(time.Second + 10*time.Millisecond - min(back, time.Second))
	second := burst(c, urls, 300)
	t.Logf("%s: first wave %d admitted (per instance %v) in %v, leases back after %v, second wave %d admitted",
		zone, first.ok, first.okPerServer, first.elapsed.Round(time.Millisecond), back.Round(time.Millisecond), second.ok)
	if len(second.errs) > 0 || len(second.other) > 0 {
		t.Errorf("%s, second wave: errors %v, other statuses %v", zone, firstErr(second.errs), second.other)
	}
	if total := first.ok + second.ok; total != limit {
		t.Errorf("%s: %d + %d admitted, want exactly %d in all", zone, first.ok, second.ok, limit)
	}
}

// TestLeasesGivenBackAtCleanup: units a lease holds go back to Redis
// when a config reload replaces the handler and when Caddy stops, so none
// is stranded until the key expires.
func TestLeasesGivenBackAtCleanup(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	site := func(body string) string {
		return strings.Replace(redisSite(redisURLBlock(srv.Addr(), redisTimeout),
			redisRoute{path: "/fw", zone: "key global\nalgorithm fixed_window\nrate 100/1h\nlocal_quota 1"}),
			`respond "ok"`, `respond "`+body+`"`, 1)
	}
	awayFromBoundary(t, time.Hour, 30*time.Second)
	inst := caddyproc.Start(t, site("v1"))
	observer := startObserver(t, site("v1"))
	c := newClient(t)
	taken := func() int64 { return takenInRedis(t, observer, "fw") }

	// Leases of 1, 2 and 4: 7 taken for 4 admitted, 3 held.
	wantCodes(t, "before the reload", sequence(t, c, 4, inst.URL("/fw")), 200, 200, 200, 200)
	if n := taken(); n != 7 {
		t.Fatalf("%d taken in Redis after 4 requests, want 7 (leases of 1, 2 and 4)", n)
	}
	if err := inst.Load(site("v2")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	if n := taken(); n != 4 {
		t.Errorf("%d taken in Redis after the reload, want the 4 admitted: the old handler's lease was not given back", n)
	}
	// The new handler leases afresh: 1, then 2 for the next two requests.
	rs := sequence(t, c, 2, inst.URL("/fw"))
	wantCodes(t, "after the reload", rs, 200, 200)
	if rs[0].body != "v2" {
		t.Fatalf("body %q: the reload did not take effect", rs[0].body)
	}
	wantRemaining(t, "after the reload", rs[1:], "fw", 100-7+1)
	inst.Stop()
	if n := taken(); n != 6 {
		t.Errorf("%d taken in Redis after Caddy stopped, want the 6 admitted", n)
	}
}

// TestDenyCacheThroughCaddy: a key Redis refused is refused from memory, with
// Retry-After counting down and the other fields unchanged, and no script
// runs in Redis until the cache's duration has passed.
func TestDenyCacheThroughCaddy(t *testing.T) {
	t.Parallel()
	srv, inst := startRedisSite(t, redisTimeout,
		redisRoute{path: "/fw", zone: "key global\nalgorithm fixed_window\nrate 2/1h\ndeny_cache 3s"},
		redisRoute{path: "/off", zone: "key global\nalgorithm fixed_window\nrate 2/1h\ndeny_cache off"})
	awayFromBoundary(t, time.Hour, 30*time.Second)
	c := newClient(t)
	client := srv.Client(t)
	scripts := func() int64 {
		calls, err := evalCalls(context.Background(), client)
		if err != nil {
			t.Fatal(err)
		}
		return calls
	}
	for _, path := range []string{"/fw", "/off"} {
		rs := sequence(t, c, 3, inst.URL(path))
		wantCodes(t, path, rs, 200, 200, 429)
		refused := rs[2]
		before := scripts()
		time.Sleep(1100 * time.Millisecond)
		again := get(t, c, inst.URL(path))
		ran := scripts() - before
		if again.code != http.StatusTooManyRequests {
			t.Fatalf("%s: refused key answered %d", path, again.code)
		}
		for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
			if again.header.Get(h) != refused.header.Get(h) {
				t.Errorf("%s: %s %q, was %q", path, h, again.header.Get(h), refused.header.Get(h))
			}
		}
		first, later := intHeader(t, refused, "Retry-After"), intHeader(t, again, "Retry-After")
		if later != first-1 && later != first-2 {
			t.Errorf("%s: Retry-After %d a second after %d, want it counted down", path, later, first)
		}
		switch {
		case path == "/fw" && ran != 0:
			t.Errorf("/fw: %d scripts ran in Redis for a cached refusal", ran)
		case path == "/off" && ran == 0:
			t.Errorf("/off: no script ran with deny_cache off")
		}
	}
}

// TestLeasesRedisKilled: with Redis gone, requests a lease still
// covers pass from memory; once it is spent the fail mode applies, and no
// request waits past the decision timeout.
func TestLeasesRedisKilled(t *testing.T) {
	t.Parallel()
	srv, inst := startRedisSite(t, "200ms",
		redisRoute{path: "/closed", zone: "key global\nalgorithm sliding_window_log\nrate 1000/1h\nlocal_quota 1\nfail closed"})
	c := newClient(t)
	// Leases of 1, 2, 4, 8 and 16: 31 taken, 16 requests made, 15 held.
	rs := sequence(t, c, 16, inst.URL("/closed"))
	for i, r := range rs {
		if r.code != http.StatusOK {
			t.Fatalf("request %d before the kill: %d", i, r.code)
		}
	}
	srv.Stop()
	var codes []int
	for range 20 {
		r := get(t, c, inst.URL("/closed"))
		if r.took() > 200*time.Millisecond+time.Second {
			t.Errorf("a request took %v with Redis gone", r.took())
		}
		codes = append(codes, r.code)
	}
	want := make([]int, 20)
	for i := range want {
		want[i] = http.StatusServiceUnavailable
		if i < 15 {
			want[i] = http.StatusOK
		}
	}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("with Redis killed: %v, want 15 from the lease then fail closed's 503", codes)
	}
}

// TestLeasesWithTiersDryRunAndFailLocal: leases keep the other features
// working. A tier's own quota sizes its leases and each tier admits
// exactly its limit; a dry_run zone with leases counts down but never
// refuses; with Redis gone, `fail local` decides from this instance's
// memory store.
func TestLeasesWithTiersDryRunAndFailLocal(t *testing.T) {
	t.Parallel()
	srv, inst := startRedisSite(t, redisTimeout,
		redisRoute{path: "/tiered", zone: "key global\nalgorithm fixed_window\nrate 10/1h\nlocal_quota 0.5\ntier {header.X-Plan} {\ngold 20/1h\n}"},
		redisRoute{path: "/dry", zone: "key global\nalgorithm sliding_window_log\nrate 3/1h\nlocal_quota 1\ndry_run"},
		redisRoute{path: "/local", zone: "key global\nalgorithm fixed_window\nrate 5/1h\nlocal_quota 1\nfail local"},
	)
	awayFromBoundary(t, time.Hour, 30*time.Second)
	c := newClient(t)
	defer func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	}()
	count := func(rs []response) (ok, refused int) {
		for _, r := range rs {
			switch r.code {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("status %d", r.code)
			}
		}
		return ok, refused
	}
	if ok, refused := count(sequence(t, c, 25, inst.URL("/tiered"), "X-Plan", "gold")); ok != 20 || refused != 5 {
		t.Errorf("gold tier: %d admitted, %d refused of 25; want its own 20", ok, refused)
	}
	if ok, refused := count(sequence(t, c, 13, inst.URL("/tiered"))); ok != 10 || refused != 3 {
		t.Errorf("the zone's own limit: %d admitted, %d refused of 13; want 10", ok, refused)
	}
	dry := sequence(t, c, 6, inst.URL("/dry"))
	wantCodes(t, "dry_run with leases", dry, 200, 200, 200, 200, 200, 200)
	wantRemaining(t, "dry_run with leases", dry[:3], "dry", 2, 1, 0)
	// Two requests on Redis take leases of 1 and 2, one unit left. With
	// Redis gone the next request spends it, unless a loaded machine took
	// longer than the lease's second to stop Redis, and fail local decides
	// the rest from memory: 5 a window.
	wantCodes(t, "fail local before", sequence(t, c, 2, inst.URL("/local")), 200, 200)
	leased := time.Now()
	srv.Stop()
	stopped := time.Since(leased)
	ok, refused := count(sequence(t, c, 8, inst.URL("/local")))
	lo, hi := 5, 6 // the lease's unit may or may not have lapsed
	switch {
	case stopped < leaseLifetime/2:
		lo = 6
	case stopped > 2*leaseLifetime:
		hi = 5
	}
	if ok < lo || ok > hi || ok+refused != 8 {
		t.Errorf("fail local with Redis gone (stopped in %v): %d admitted, %d refused of 8; want %d to %d: the lease's last unit and the local limit of 5", stopped, ok, refused, lo, hi)
	}
}

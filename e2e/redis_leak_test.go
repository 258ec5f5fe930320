package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// leakSettle bounds how long a replaced config's goroutines may take to
// end once nothing runs in it: its Redis client is released releaseGrace
// after the reload, and its connections' readers need to notice, on a
// machine that may be busy.
const leakSettle = releaseGrace + 15*time.Second

// leakSite serves every kind of redis zone, one path each: a plain zone
// that asks Redis for every decision (fail open, no denial cache), a
// concurrency zone whose slots are renewed while its requests run, held
// by upstream (fail local), a token bucket that fails closed, a zone with
// local_quota leases and one whose refusals the denial cache repeats.
// Every zone has a short timeout, so requests while Redis is paused end
// in their fail mode quickly. redisBlock names the servers, with no
// timeout.
func leakSite(redisBlock, upstream string) string {
	zone := func(path, opts string) redisRoute {
		return redisRoute{path: path, zone: "key {header.X-Client}\n" + opts}
	}
	routes := []redisRoute{
		zone("/plain", "algorithm sliding_window_log\nrate 1000/1h\ndeny_cache off\nfail open"),
		zone("/concurrency", "algorithm concurrency\nevents 100\nwindow 300ms\nfail local"),
		zone("/closed", "algorithm token_bucket\nrate 1000/1h\nfail closed"),
		zone("/leases", "algorithm fixed_window\nrate 1000/1h\nlocal_quota 0.5\nfail open"),
		zone("/denied", "algorithm fixed_window\nrate 1/1h\ndeny_cache 1m\nfail open"),
	}
	routes[1].upstream = upstream
	return redisSite(strings.TrimSuffix(redisBlock, "}")+"timeout 50ms\n}", routes...)
}

// plainSite is a config without any rate_limit: what a reload to it
// leaves of the replaced config's zones must end.
const plainSite = `
http://{{http}} {
	respond "plain"
}
`

// TestRedisHandlerNoGoroutineLeak: a config with every kind of redis zone
// serves requests with Redis up, paused and back, one concurrency request
// still held at the upstream across the reload that replaces it with a
// config without rate limits; once that request is done, no goroutine of
// Floodgate or go-redis is left in Caddy (its goroutine profile, from
// pprof on the admin endpoint). Twice, so a first cycle cannot hide what
// the second leaves behind. On a standalone server, and on three shards
// of which one is paused (per-shard pipelines, breakers and give-backs).
func TestRedisHandlerNoGoroutineLeak(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		checkNoGoroutineLeak(t, fmt.Sprintf("redis {\nurl redis://%s\n}", srv.Addr()), srv)
	})
	t.Run("shards", func(t *testing.T) {
		t.Parallel()
		servers := startShardServers(t, 3)
		block := fmt.Sprintf("redis {\nshards %s %s %s\n}", servers[0].Addr(), servers[1].Addr(), servers[2].Addr())
		checkNoGoroutineLeak(t, block, servers[1])
	})
}

// checkNoGoroutineLeak is TestRedisHandlerNoGoroutineLeak on the servers
// redisBlock names, pausing srv.
func checkNoGoroutineLeak(t *testing.T, redisBlock string, srv *redistest.Server) {
	up := newUpstream(t, 0)
	zones := leakSite(redisBlock, up.url)
	inst := caddyproc.Start(t, globalsWith("")+plainSite)
	c := newClient(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	paths := []string{"/plain", "/concurrency", "/closed", "/leases", "/denied"}
	many := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 4*len(paths))
		for i := range 4 * len(paths) {
			wg.Go(func() {
				r, err := send(c, http.MethodGet, inst.URL(paths[i%len(paths)]), clientHeader(fmt.Sprintf("c%d", i%3))...)
				if err == nil && r.code != 200 && r.code != 429 && r.code != 503 {
					err = fmt.Errorf("%s: status %d", paths[i%len(paths)], r.code)
				}
				if err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s: %v", what, err)
		}
	}
	for cycle := 1; cycle <= 2; cycle++ {
		if err := inst.Load(zones); err != nil {
			t.Fatalf("cycle %d: loading the redis zones: %v", cycle, err)
		}
		many("Redis up")
		srv.Pause()
		many("Redis paused")
		srv.Resume()
		many("Redis back")

		// A concurrency request runs across the reload: its slot is
		// renewed until it ends, after the handler's Cleanup.
		up.hold()
		held := make(chan error, 1)
		go func() {
			r, err := send(c, http.MethodGet, inst.URL("/concurrency"), clientHeader("held")...)
			if err == nil && r.code != 200 {
				err = fmt.Errorf("status %d", r.code)
			}
			held <- err
		}()
		up.waitArrivals(t, 1)
		// The profile shows Floodgate's goroutines while they run (the
		// held request's, the slot renewer): the check below can see
		// what a config leaves behind.
		running := ownGoroutines(t, inst)
		if !slices.ContainsFunc(running, func(g string) bool { return strings.Contains(g, "caddy-ratelimit.(*Handler).ServeHTTP") }) {
			t.Fatalf("cycle %d: no goroutine of Floodgate's handler in the profile while a request is held in it:\n\n%s", cycle, strings.Join(running, "\n\n"))
		}
		t.Logf("cycle %d: %d goroutines of Floodgate and go-redis while a request is held", cycle, len(running))
		time.AfterFunc(time.Second, up.open)
		if err := inst.Load(globalsWith("") + plainSite); err != nil {
			t.Fatalf("cycle %d: reloading without rate limits: %v", cycle, err)
		}
		if err := <-held; err != nil {
			t.Errorf("cycle %d: the request held across the reload: %v", cycle, err)
		}
		took := testutil.Within(t, fmt.Sprintf("cycle %d: the goroutines of Floodgate and go-redis to end after the reload", cycle), leakSettle, func() error {
			if left := ownGoroutines(t, inst); len(left) > 0 {
				return fmt.Errorf("%d left:\n\n%s", len(left), strings.Join(left, "\n\n"))
			}
			return nil
		})
		n, _ := goroutineProfile(t, inst, 1)
		t.Logf("cycle %d: none of Floodgate's or go-redis's goroutines left %v after the reload; Caddy runs %d goroutines", cycle, took.Round(time.Millisecond), n)
	}
}

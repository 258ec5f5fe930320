package e2e

import (
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// warmSite is a site whose one zone keeps its state on redisAddr with a
// tight timeout: a first decision that also had to dial and load its
// script could run past it and fail open, without headers.
func warmSite(redisAddr, body string) string {
	return oneRedisZoneSite("warm", "fixed_window\nevents 5\nwindow 1h", redisAddr, "100ms", body)
}

// TestRedisWarmStart: a config that starts, or a reload that moves a zone
// to another redis-server, has connected and loaded the zone's scripts
// before it serves, so the first request is an ordinary decision and
// carries the zone's headers.
func TestRedisWarmStart(t *testing.T) {
	t.Parallel()
	one, two := redistest.Start(t), redistest.Start(t)
	warmed := func(what string, s *redistest.Server) {
		t.Helper()
		// The server is the zone's alone: the cached scripts are the
		// zone's two, the one that decides and the one that gives leases
		// back (docs/redis.md, "The warm start": it loads both),
		// and the probe that asks whether scripts may call TIME.
		if n := infoInt(t, s, "memory", "number_of_cached_scripts"); n != 3 {
			t.Errorf("%s: %d scripts cached before the first request, want the zone's 2 and the TIME probe", what, n)
		}
		if len(caddyConnIDs(t, s)) == 0 {
			t.Errorf("%s: Caddy has not connected before the first request", what)
		}
	}
	inst := caddyproc.Start(t, warmSite(one.Addr(), "v1"))
	warmed("after the start", one)
	c := newClient(t)
	wantRemaining(t, "the first request after the start", sequence(t, c, 1, inst.URL("/"), clientHeader("k")...), "warm", 4)

	if err := inst.Load(warmSite(two.Addr(), "v2")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	warmed("after a reload to another server", two)
	wantRemaining(t, "the first request after the reload", sequence(t, c, 1, inst.URL("/"), clientHeader("k")...), "warm", 4)
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

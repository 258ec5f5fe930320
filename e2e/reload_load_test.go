package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// Shape of TestHTTPReloadUnderLoad: reloadClients clients send requests
// without pause while Caddy takes reloadCount reloads, each begun once
// every client has had answers since the last (so every reload lands
// amid load). reloadLimit is small, so the zone is exhausted after a few
// reloads and every request an old handler lets through unlimited shows.
const (
	reloadClients = 12
	reloadCount   = 20
	reloadLimit   = 100
	// reloadHeld requests per reload are held by the first handler (see
	// reloadLoadSite) while the reload happens, so that the old config's
	// second handler decides them after its Cleanup.
	reloadHeld = 2
	// reloadSettle bounds how long the goroutines and Redis connections
	// of replaced configs may take to go once the load stops: the
	// handler's release grace and a margin for a loaded machine.
	reloadSettle = releaseGrace + 15*time.Second
)

// reloadLoadSite is config i of the reload sequence: the same zone (a
// global fixed window) each time, with the response body alternating, and
// for Redis a client name of its own (reloadClientName), so that every
// reload replaces the client, the old one must be handed back once its
// handler is done, and its connections can be told from the new one's.
func reloadLoadSite(redisAddr string, i int) string {
	store := ""
	if redisAddr != "" {
		store = fmt.Sprintf(`store redis
		}
		redis {
			url redis://%s/0?client_name=%s
			timeout %s`, redisAddr, reloadClientName(i), redisTimeout)
	}
	// The first handler holds requests marked X-Hold up to 500ms, 250ms
	// apart: a reload that lands meanwhile leaves them to the old config's
	// second handler, which decides them once the old config is cleaned up
	// (net/http drops requests read after a server's shutdown, so those in
	// a handler chain are the only ones an old handler still serves).
	return globals + fmt.Sprintf(`
http://{{http}} {
	route {
		header X-Config v%[3]d
		rate_limit {
			zone hold {
				match {
					header X-Hold 1
				}
				key global
				algorithm leaky_bucket
				events 1
				window 250ms
				max_delay 500ms
			}
		}
		rate_limit {
			zone flood {
				key global
				algorithm fixed_window
				events %[1]d
				window 1h
				%[2]s
			}
		}
		respond "v%[3]d"
	}
}
`, reloadLimit, store, i%2)
}

// TestHTTPReloadUnderLoad: a handler goes on limiting after Caddy has
// replaced and cleaned up its config, for the requests its servers are
// still serving. Under load across reloadCount reloads, no request fails
// except by the zone's 429, the zone admits exactly its limit, every
// admitted response carries the zone's headers (no decision failed open),
// and once the load stops Caddy is back to its goroutine count from
// before the reloads and, for Redis, holds no more connections than its
// current client's pool.
func TestHTTPReloadUnderLoad(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		runReloadUnderLoad(t, nil)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		runReloadUnderLoad(t, redistest.Start(t))
	})
}

// reloadClientName names the Redis connections of config i.
func reloadClientName(i int) string { return "floodgate-reload-" + strconv.Itoa(i) }

func runReloadUnderLoad(t *testing.T, srv *redistest.Server) {
	addr := ""
	if srv != nil {
		addr = srv.Addr()
	}
	inst := caddyproc.Start(t, reloadLoadSite(addr, 0))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	// Kept-alive connections, as browsers and proxies use: a reload finds
	// requests in progress on the old servers' connections.
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: reloadClients}
	c := &http.Client{Transport: tr, Timeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	url := inst.URL("/")

	// The baseline: the first config serving, its connections gone.
	if r, err := send(c, http.MethodGet, url); err != nil || r.code != http.StatusOK {
		t.Fatalf("first request: %v %d", err, r.code)
	}
	tr.CloseIdleConnections()
	baseline := settledGoroutines(t, inst, -1)

	var admitted, refused, answers atomic.Int64
	var failMu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		failMu.Lock()
		defer failMu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	count := func(r response, err error) {
		switch {
		case err != nil:
			fail("request failed: %v", err)
		case r.code == http.StatusTooManyRequests:
			refused.Add(1)
		case r.code != http.StatusOK:
			fail("status %d: %s", r.code, r.body)
		case !r.hasRateLimitHeaders():
			fail("200 without rate-limit headers: no zone decided it (body %q)", r.body)
			admitted.Add(1)
		default:
			admitted.Add(1)
		}
	}
	stop := testutil.Repeat(reloadClients, func() bool {
		r, err := send(c, http.MethodGet, url)
		count(r, err)
		answers.Add(1)
		return true
	})
	// wg waits for the requests each reload holds.
	var wg sync.WaitGroup
	// The first request took one unit before the load began.
	admitted.Add(1)
	// straddled counts held requests the old config decided after Cleanup.
	var straddled int
	for i := 1; i <= reloadCount; i++ {
		// Every client has had an answer since the last reload: the load
		// is on when this one begins, however slow the machine.
		for from := answers.Load(); answers.Load() < from+reloadClients; {
			time.Sleep(time.Millisecond)
		}
		held := make(chan response, reloadHeld)
		for range reloadHeld {
			wg.Go(func() {
				r, err := send(c, http.MethodGet, url, "X-Hold", "1")
				count(r, err)
				held <- r
			})
		}
		err := inst.Load(reloadLoadSite(addr, i))
		loaded := time.Now()
		for range reloadHeld {
			// Served by the old config, answered after the reload had
			// cleaned it up: decided by its second handler after Cleanup.
			if r := <-held; r.header.Get("X-Config") == fmt.Sprintf("v%d", (i-1)%2) && r.done.After(loaded) {
				straddled++
			}
		}
		if err != nil {
			stop()
			wg.Wait()
			t.Fatalf("reload %d: %v\n%s", i, err, inst.Log())
		}
	}
	stop()
	wg.Wait()
	// The load may have ended before the zone was exhausted; exhaust it
	// now, one request at a time, so "exactly the limit" is a full check.
	for refused.Load() == 0 && admitted.Load() <= reloadLimit {
		r, err := send(c, http.MethodGet, url)
		if err != nil || (r.code != http.StatusOK && r.code != http.StatusTooManyRequests) {
			t.Fatalf("after the reloads: %v %d", err, r.code)
		}
		if r.code == http.StatusOK {
			admitted.Add(1)
		} else {
			refused.Add(1)
		}
	}
	t.Logf("%d requests over %d reloads: %d admitted, %d refused; %d held across a reload and decided by the old config after it",
		answers.Load(), reloadCount, admitted.Load(), refused.Load(), straddled)
	if straddled == 0 {
		t.Errorf("none of the %d requests held across reloads was decided by a replaced config: the test did not test what it means to", reloadCount*reloadHeld)
	}
	for _, f := range failures {
		t.Error(f)
	}
	if got := admitted.Load(); got != reloadLimit {
		t.Errorf("the zone admitted %d requests across the reloads, want exactly its limit %d", got, reloadLimit)
	}

	tr.CloseIdleConnections()
	settledGoroutines(t, inst, baseline)
	if srv != nil {
		waitReplacedClientsClosed(t, srv, reloadClientName(reloadCount))
	}
}

// settledGoroutines waits until Caddy's goroutine count (from pprof on the
// admin endpoint) is at most want and returns it; want < 0 waits for two
// equal readings in a row instead, which is the baseline. It fails the
// test if the count stays above want for reloadSettle, with the profile.
func settledGoroutines(t *testing.T, inst *caddyproc.Instance, want int) int {
	t.Helper()
	deadline := time.Now().Add(reloadSettle)
	last := -1
	for {
		n, profile := goroutineProfile(t, inst, 1)
		if (want >= 0 && n <= want) || (want < 0 && n == last) {
			return n
		}
		if time.Now().After(deadline) {
			if want < 0 {
				return n
			}
			t.Errorf("Caddy runs %d goroutines %v after the load stopped, %d before the reloads:\n%s", n, reloadSettle, want, profile)
			return n
		}
		last = n
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReplacedClientsClosed fails the test unless, within reloadSettle,
// every connection of Caddy's on srv is named current: the clients of the
// replaced configs have all been closed.
func waitReplacedClientsClosed(t *testing.T, srv *redistest.Server, current string) {
	t.Helper()
	stale := func(name string) bool { return strings.HasPrefix(name, "floodgate-reload-") && name != current }
	testutil.Within(t, "the connections of replaced configs' clients to close after the load stopped", reloadSettle, func() error {
		if open := clientsNamed(t, srv, stale); len(open) > 0 {
			return fmt.Errorf("%d open: %v", len(open), open)
		}
		return nil
	})
}

package e2e

// End-to-end tests of rate_limit_status: a client's own state per zone,
// as JSON, through a real Caddy with a memory zone and a redis zone.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// statusSite serves an API under /api/ limited by a memory zone keyed by
// an API key, with a tier, and a redis zone keyed by client IP; its own
// state at /rate_limit; and on {{http2}} a second site that answers only
// the memory zone. quota is the memory zone's limit.
func statusSite(redisAddr string, quota int) string {
	return globals + fmt.Sprintf(`
http://{{http}} {
	handle /rate_limit {
		rate_limit_status
	}
	handle /api/* {
		rate_limit {
			zone status_mem {
				key {header.X-API-Key}
				algorithm token_bucket
				rate %d/1h
				tier {header.X-Plan} {
					gold 100/1h
				}
			}
			zone status_red {
				key {client_ip}
				rate 20/1h
				store redis
			}
			redis {
				url redis://%s
				timeout 2s
			}
		}
		respond "ok"
	}
}

http://{{http2}} {
	rate_limit_status status_mem
}
`, quota, redisAddr)
}

// TestClientStatus: a client's status after three requests shows three
// fewer in a memory zone and a redis zone; asking again changes nothing
// (nor what the next request is left); neither the API key nor the client
// IP is in any answer; the client's tier is the limit answered; a status
// site of its own answers the zone it names; and after a reload the new
// config's limit is answered.
func TestClientStatus(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	inst := caddyproc.Start(t, statusSite(srv.Addr(), 10))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	c := newClient(t)
	const apiKey, ip = "key-7f3c-secret", "203.0.113.57"
	secrets := []string{apiKey, ip}
	client := []string{"X-API-Key", apiKey, "X-Forwarded-For", ip}
	status := inst.URL("/rate_limit")

	got, _ := askStatus(t, c, status, secrets, client...)
	wantStatus(t, "before any request", got, "status_mem", 10, 10, 3600)
	wantStatus(t, "before any request", got, "status_red", 20, 20, 3600)
	if len(got) != 2 {
		t.Errorf("answered %d zones, want 2: %+v", len(got), got)
	}

	expectCodes(t, "three API requests", c, inst.URL("/api/items"), []int{200, 200, 200}, client...)
	got, first := askStatus(t, c, status, secrets, client...)
	wantStatus(t, "after three requests", got, "status_mem", 10, 7, 3600)
	wantStatus(t, "after three requests", got, "status_red", 20, 17, 3600)
	got, _ = askStatus(t, c, status, secrets, client...)
	wantStatus(t, "asked again", got, "status_mem", 10, 7, 3600)
	wantStatus(t, "asked again", got, "status_red", 20, 17, 3600)

	// The next API request is the fourth: status requests took nothing.
	r := get(t, c, inst.URL("/api/items"), client...)
	if rl := r.header.Get("RateLimit"); !strings.Contains(rl, `"status_mem";r=6;`) || !strings.Contains(rl, `"status_red";r=16;`) {
		t.Errorf("RateLimit %q on the fourth request: want status_mem r=6 and status_red r=16 (after %s)", rl, first)
	}

	// The same key on the gold tier has a limit, and state, of its own.
	gold := append([]string{"X-Plan", "gold"}, client...)
	got, body := askStatus(t, c, status, secrets, gold...)
	wantStatus(t, "gold tier", got, "status_mem", 100, 100, 3600)
	if strings.Contains(body, "gold") {
		t.Errorf("the answer %q names the tier", body)
	}

	// The status site of {{http2}} names only the memory zone.
	got, _ = askStatus(t, c, inst.URLOn("http2", "/"), secrets, client...)
	wantStatus(t, "the other site", got, "status_mem", 10, 6, 3600)
	if len(got) != 1 {
		t.Errorf("the other site answered %+v, want status_mem alone", got)
	}

	// A reload with another limit: the new limit's state is answered, not
	// the replaced config's.
	if err := inst.Load(statusSite(srv.Addr(), 12)); err != nil {
		t.Fatal(err)
	}
	got, _ = askStatus(t, c, status, secrets, client...)
	wantStatus(t, "after the reload", got, "status_mem", 12, 12, 3600)
	wantStatus(t, "after the reload", got, "status_red", 20, 16, 3600)
	if len(got) != 2 {
		t.Errorf("after the reload: answered %+v, want the two zones once each", got)
	}
}

// TestClientStatusExample runs the example of docs/client-status.md,
// examples/rate-limit-status.Caddyfile, as written: on the harness's
// ports its status answers as that page says, for a pro key and for no
// key.
func TestClientStatusExample(t *testing.T) {
	t.Parallel()
	inst := startExample(t, "rate-limit-status.Caddyfile", "")
	c := newClient(t)
	pro := []string{"X-API-Key", "key-abc"}
	expectCodes(t, "three API requests", c, inst.URL("/api/orders"), []int{200, 200, 200}, pro...)
	got, _ := askStatus(t, c, inst.URL("/rate_limit"), []string{"key-abc", "127.0.0.1"}, pro...)
	wantStatus(t, "the pro key", got, "api", 1000, 997, 3600)
	// per_ip refills a token a second: at least 7 of its 10 are left.
	if z := got["per_ip"]; z.Limit != 10 || z.Window != 10 || z.Remaining < 7 || z.Remaining > 10 {
		t.Errorf("per_ip: %+v, want limit 10, window 10, at least 7 left", z)
	}
	got, _ = askStatus(t, c, inst.URL("/rate_limit"), []string{"127.0.0.1"})
	wantStatus(t, "no key", got, "api", 100, 100, 3600)
	if len(got) != 2 {
		t.Errorf("no key: answered %+v, want api and per_ip", got)
	}
}

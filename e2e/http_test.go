package e2e

// End-to-end tests: a real Caddy built with Floodgate, configured by
// Caddyfile, driven over HTTP on loopback with the real clock. They check
// what unit tests of the handler cannot: directive order, handle_errors,
// placeholders seen by later handlers, reloads through the admin API, and
// the headers as a client parses them.
//
// Every test runs its own Caddy on its own ports, in parallel. Limits that
// must hold are set over minutes or hours, so a slow machine cannot refill
// them mid-test; the tests that measure refills and delays allow hundreds of
// milliseconds of slack.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestHTTPAlgorithms runs each window and bucket algorithm's allow and deny
// sequence through Caddy, with the headers each response carries.
func TestHTTPAlgorithms(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		zone string
		// boundary is the aligned window a counter resets on; tests of
		// such algorithms avoid running across it.
		boundary  time.Duration
		codes     []int
		remaining []int64
		policy    string // the zone's RateLimit-Policy member
		retryLo   int64
		retryHi   int64
		// check makes algorithm-specific assertions on the responses.
		check func(t *testing.T, rs []response, windowEnd time.Time)
	}{{
		name: "token_bucket",
		zone: `key ip
			algorithm token_bucket
			rate 5/m
			burst 3`,
		codes:     []int{200, 200, 200, 429},
		remaining: []int64{2, 1, 0, 0},
		// q = B, w = B/r = 3 / (5/60s) = 36s.
		policy:  `"z";q=3;w=36`,
		retryLo: 1, retryHi: 12, // one token comes back every 12s
		check: func(t *testing.T, rs []response, _ time.Time) {
			// Full again (B - tokens)/r after the third request: 36s.
			wantResetWithin(t, rs[2], 34*time.Second, 37*time.Second)
		},
	}, {
		name: "leaky_bucket",
		zone: `key ip
			algorithm leaky_bucket
			rate 1/m`,
		// B = 1, so the default max_delay (B-1)/r is zero: one request
		// passes at once and the next must wait a minute.
		codes:     []int{200, 429, 429},
		remaining: []int64{0, 0, 0},
		policy:    `"z";q=1;w=60`,
		retryLo:   55, retryHi: 60,
		check: func(t *testing.T, rs []response, _ time.Time) {
			wantResetWithin(t, rs[0], 55*time.Second, 61*time.Second)
		},
	}, {
		name: "fixed_window",
		zone: `key ip
			algorithm fixed_window
			events 3
			window 1h`,
		boundary:  time.Hour,
		codes:     []int{200, 200, 200, 429},
		remaining: []int64{2, 1, 0, 0},
		policy:    `"z";q=3;w=3600`,
		retryLo:   1, retryHi: 3600,
		check: func(t *testing.T, rs []response, end time.Time) {
			// Reset and Retry-After are the end of the aligned hour. The
			// handler computes the reset from the decision's own time, on
			// the store's clock, so the window's end is reported exactly.
			for i, r := range rs {
				if got := intHeader(t, r, "X-RateLimit-Reset"); got != end.Unix() {
					t.Errorf("request %d: X-RateLimit-Reset %d, want the window's end %d", i+1, got, end.Unix())
				}
			}
			wantRetryAbout(t, rs[3], end, "the window's end")
		},
	}, {
		// No algorithm: mholt's key/window/events is an exact sliding window.
		name: "sliding_window_log default",
		zone: `key {remote_host}
			window 1m
			events 3`,
		codes:     []int{200, 200, 200, 429},
		remaining: []int64{2, 1, 0, 0},
		policy:    `"z";q=3;w=60`,
		retryLo:   50, retryHi: 60,
		check: func(t *testing.T, rs []response, _ time.Time) {
			// Back to empty a window after the newest entry.
			wantResetWithin(t, rs[2], 55*time.Second, 61*time.Second)
		},
	}, {
		name: "sliding_window_counter",
		zone: `key ip
			algorithm sliding_window_counter
			events 3
			window 1h`,
		boundary:  time.Hour,
		codes:     []int{200, 200, 200, 429},
		remaining: []int64{2, 1, 0, 0},
		policy:    `"z";q=3;w=3600`,
		retryLo:   1, retryHi: 3600 + 1200,
		check: func(t *testing.T, rs []response, end time.Time) {
			// The three units move to the previous window at the end of
			// this one, and their weight falls to 2/3 of a window a
			// third of the way into the next: est + 1 <= 3.
			wantRetryAbout(t, rs[3], end.Add(20*time.Minute), "a third into the next window")
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inst := caddyproc.Start(t, site("\t\tzone z {\n\t\t\t"+tc.zone+"\n\t\t}"))
			c := newClient(t)
			var end time.Time
			if tc.boundary > 0 {
				end = awayFromBoundary(t, tc.boundary, 15*time.Second)
			}
			rs := sequence(t, c, len(tc.codes), inst.URL("/"))
			wantCodes(t, tc.name, rs, tc.codes...)
			wantRemaining(t, tc.name, rs, "z", tc.remaining...)
			for i, r := range rs {
				if got := r.header.Get("RateLimit-Policy"); got != tc.policy {
					t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, tc.policy)
				}
				q := intParam(t, zoneParams(t, r, "RateLimit-Policy", "z"), "q")
				if got := intHeader(t, r, "X-RateLimit-Limit"); got != q {
					t.Errorf("request %d: X-RateLimit-Limit %d, want the policy's q=%d", i+1, got, q)
				}
				if r.code == http.StatusTooManyRequests {
					checkDenial(t, r, "z", tc.retryLo, tc.retryHi)
				} else if ra := r.header.Get("Retry-After"); ra != "" {
					t.Errorf("request %d: Retry-After %q on an admitted request", i+1, ra)
				}
			}
			if tc.check != nil {
				tc.check(t, rs, end)
			}
			if t.Failed() {
				t.Logf("caddy log:\n%s", inst.Log())
			}
		})
	}
}

// TestHTTPConcurrency holds requests in an upstream: L+1 concurrent
// requests give exactly one 429, and the slots come back when the held
// requests finish.
func TestHTTPConcurrency(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0)
	up.hold()
	const limit = 2
	inst := caddyproc.Start(t, globals+`
http://{{http}} {
	rate_limit {
		zone conc {
			key ip
			algorithm concurrency
			events 2
		}
	}
	reverse_proxy `+up.url+`
}
`)
	c := newClient(t)

	results := make(chan response, limit+1)
	errs := make(chan error, limit+1)
	hold := inst.URL("/hold")
	// sendHeld sends n requests that the upstream holds until released.
	sendHeld := func(n int) {
		for range n {
			go func() {
				r, err := send(c, http.MethodGet, hold)
				if err != nil {
					errs <- err
					return
				}
				results <- r
			}()
		}
	}
	// wantReleasedOK waits for the limit held requests to finish, with 200,
	// once released; what names them in a failure.
	wantReleasedOK := func(what string) {
		t.Helper()
		for range limit {
			select {
			case r := <-results:
				if r.code != http.StatusOK {
					t.Errorf("%s: status %d, want 200", what, r.code)
				}
			case err := <-errs:
				t.Fatal(err)
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: did not finish after release", what)
			}
		}
	}
	sendHeld(limit + 1)
	up.waitArrivals(t, limit)
	var denied response
	select {
	case denied = <-results:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("no response while two requests are held")
	}
	// Nothing to wait for but a response to finish: Retry-After is the minimum.
	checkDenial(t, denied, "conc", 1, 1)
	pol := zoneParams(t, denied, "RateLimit-Policy", "conc")
	if intParam(t, pol, "q") != limit || pol["qu"] != "concurrent-requests" {
		t.Errorf("RateLimit-Policy %q, want q=%d and qu=\"concurrent-requests\"", denied.header.Get("RateLimit-Policy"), limit)
	}
	if got := intHeader(t, denied, "X-RateLimit-Limit"); got != limit {
		t.Errorf("X-RateLimit-Limit %d, want %d", got, limit)
	}
	select {
	case r := <-results:
		t.Fatalf("a second response (%d) while two requests are held", r.code)
	case <-time.After(200 * time.Millisecond):
	}

	up.open()
	wantReleasedOK("held request")

	// A slot is released just after the response is written, so poll
	// briefly until a lone request sees every other slot free.
	testutil.Eventually(t, "the slots to come back", func() error {
		r := get(t, c, inst.URL("/fast"))
		if r.code == http.StatusOK && intHeader(t, r, "X-RateLimit-Remaining") == limit-1 {
			return nil
		}
		return fmt.Errorf("status %d, remaining %q", r.code, r.header.Get("X-RateLimit-Remaining"))
	})
	// And L requests can be in flight together again.
	up.hold()
	sendHeld(limit)
	up.waitArrivals(t, limit)
	up.open()
	wantReleasedOK("second round")
}

// TestHTTPHeaders checks every header mode on admitted and refused
// requests, the quoting of zone names, and the bucket quotas.
func TestHTTPHeaders(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globals+`
http://{{http}} {
	rate_limit {
		zone `+"`"+`we"ird\zone`+"`"+` {
			key ip
			algorithm token_bucket
			rate 100/1h
			burst 20
		}
	}
	respond "ok"
}
http://{{http2}} {
	rate_limit {
		zone none_zone {
			events 1
			window 1h
		}
		headers none
	}
	respond "ok"
}
http://{{http3}} {
	rate_limit {
		zone x_zone {
			events 1
			window 1h
		}
		headers x-ratelimit
	}
	respond "ok"
}
http://{{http4}} {
	rate_limit {
		zone ietf_zone {
			events 1
			window 1h
		}
		headers ietf
	}
	respond "ok"
}
http://{{http5}} {
	rate_limit {
		zone leaky {
			key ip
			algorithm leaky_bucket
			rate 100/1m
			burst 20
		}
		zone tb {
			key ip
			algorithm token_bucket
			rate 100/1m
			burst 20
		}
	}
	respond "ok"
}
`)
	c := newClient(t)
	const weird = `we"ird\zone`

	t.Run("both", func(t *testing.T) {
		rs := sequence(t, c, 21, inst.URL("/"))
		want := append(slices.Repeat([]int{200}, 20), 429)
		wantCodes(t, "burst 20", rs, want...)
		for _, r := range []response{rs[0], rs[20]} {
			raw := r.header.Get("RateLimit-Policy")
			// w = B/r = 20 / (100/3600s) = 720s.
			if want := `"we\"ird\\zone";q=20;w=720`; raw != want {
				t.Errorf("RateLimit-Policy %q, want %q", raw, want)
			}
			pol := fieldMembers(t, r, "RateLimit-Policy")
			if len(pol) != 1 || pol[0].zone != weird {
				t.Fatalf("RateLimit-Policy parses to %+v, want the one zone %q", pol, weird)
			}
			if q, w := intParam(t, pol[0].params, "q"), intParam(t, pol[0].params, "w"); q != 20 || w != 720 {
				t.Errorf("rate 100/1h burst 20: q=%d;w=%d, want q=20;w=720", q, w)
			}
			if rl := fieldMembers(t, r, "RateLimit"); len(rl) != 1 || rl[0].zone != weird {
				t.Errorf("RateLimit parses to %+v, want the one zone %q", rl, weird)
			}
			if got := intHeader(t, r, "X-RateLimit-Limit"); got != 20 {
				t.Errorf("X-RateLimit-Limit %d, want 20", got)
			}
		}
		if rem := intHeader(t, rs[0], "X-RateLimit-Remaining"); rem != 19 {
			t.Errorf("first request: remaining %d, want 19", rem)
		}
		// One token is 36s of refill: the first request's bucket is full
		// again 36s later, and the refused one may retry within 36s.
		if tp := intParam(t, zoneParams(t, rs[0], "RateLimit", weird), "t"); tp < 35 || tp > 36 {
			t.Errorf("first request: RateLimit t=%d, want 36", tp)
		}
		wantResetWithin(t, rs[0], 35*time.Second, 36*time.Second)
		checkDenial(t, rs[20], weird, 1, 36)
	})

	t.Run("bucket quotas", func(t *testing.T) {
		// A bucket reports its capacity and the time to refill it:
		// rate 100/1m burst 20 is twenty at once, w = 20/(100/60s) = 12s.
		r := get(t, c, inst.URLOn("http5", "/"))
		if r.code != 200 {
			t.Fatalf("status %d", r.code)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"leaky";q=20;w=12, "tb";q=20;w=12`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		if got := len(fieldMembers(t, r, "RateLimit")); got != 2 {
			t.Errorf("RateLimit has %d members, want 2", got)
		}
	})

	xFields := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	ietfFields := []string{"RateLimit", "RateLimit-Policy"}
	for _, mode := range []struct {
		name, listener string
		present        []string
		absent         []string
	}{
		{"none", "http2", nil, append(slices.Clone(xFields), ietfFields...)},
		{"x-ratelimit", "http3", xFields, ietfFields},
		{"ietf", "http4", ietfFields, xFields},
	} {
		t.Run(mode.name, func(t *testing.T) {
			rs := sequence(t, c, 2, inst.URLOn(mode.listener, "/"))
			wantCodes(t, "events 1", rs, 200, 429)
			for i, r := range rs {
				for _, f := range mode.present {
					if r.header.Get(f) == "" {
						t.Errorf("request %d: %s missing", i+1, f)
					}
				}
				for _, f := range mode.absent {
					if v := r.header.Get(f); v != "" {
						t.Errorf("request %d: %s: %q, want none with headers %s", i+1, f, v, mode.name)
					}
				}
				if slices.Contains(mode.present, "RateLimit") {
					fieldMembers(t, r, "RateLimit")
					fieldMembers(t, r, "RateLimit-Policy")
				}
			}
			// Retry-After is HTTP's own answer to a 429, kept in every mode.
			if ra := intHeader(t, rs[1], "Retry-After"); ra < 3500 || ra > 3600 {
				t.Errorf("Retry-After %d, want about an hour", ra)
			}
		})
	}
}

// TestHTTPErrorsAndPlaceholders renders the 429 in handle_errors and reads
// the decision's placeholders from handlers after rate_limit.
func TestHTTPErrorsAndPlaceholders(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globals+`
http://{{http}} {
	rate_limit {
		zone tiny {
			events 1
			window 1h
		}
	}
	respond "zone={http.rate_limit.zone} remaining={http.rate_limit.remaining} retry={http.rate_limit.retry_after}"
	handle_errors {
		header Content-Type application/json
		respond `+"`"+`{"error":"{http.rate_limit.exceeded.name}","zone":"{http.rate_limit.zone}","remaining":{http.rate_limit.remaining},"retry_after":{http.rate_limit.retry_after},"status":{http.error.status_code},"id":"{http.error.id}"}`+"`"+` 429
	}
}
http://{{http2}} {
	rate_limit {
		zone bare {
			events 1
			window 1h
		}
	}
	respond "ok"
}
`)
	c := newClient(t)
	rs := sequence(t, c, 2, inst.URL("/"))
	wantCodes(t, "events 1", rs, 200, 429)
	if want := "zone=tiny remaining=0 retry=0"; rs[0].body != want {
		t.Errorf("admitted body %q, want %q", rs[0].body, want)
	}
	var body struct {
		Error      string `json:"error"`
		Zone       string `json:"zone"`
		Remaining  int64  `json:"remaining"`
		RetryAfter int64  `json:"retry_after"`
		Status     int    `json:"status"`
		ID         string `json:"id"`
	}
	if err := json.Unmarshal([]byte(rs[1].body), &body); err != nil {
		t.Fatalf("handle_errors body %q is not JSON: %v", rs[1].body, err)
	}
	retry := checkDenial(t, rs[1], "tiny", 3500, 3600)
	if body.Error != "tiny" || body.Zone != "tiny" || body.Remaining != 0 || body.RetryAfter != retry || body.Status != 429 {
		t.Errorf("handle_errors body %+v, want zone tiny, remaining 0, retry_after %d, status 429", body, retry)
	}
	// Like every Caddy error, the refusal has an ID to find it in the logs.
	if len(body.ID) != 9 || strings.Trim(body.ID, "abcdefghijkmnpqrstuvwxyz23456789") != "" {
		t.Errorf("error ID %q, want 9 characters as caddyhttp.Error makes", body.ID)
	}
	if ct := rs[1].header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q from handle_errors, want application/json", ct)
	}

	// Without handle_errors Caddy answers the error's status, with the
	// rate-limit headers already set and no body.
	bare := sequence(t, c, 2, inst.URLOn("http2", "/"))
	wantCodes(t, "no handle_errors", bare, 200, 429)
	checkDenial(t, bare[1], "bare", 3500, 3600)
	if bare[1].body != "" {
		t.Errorf("429 without handle_errors has body %q", bare[1].body)
	}
}

// TestHTTPZonesDoNotConsumeOnDenial: a request refused by one zone leaves
// the other zones' counts as they were.
func TestHTTPZonesDoNotConsumeOnDenial(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, site(`		zone a_loose {
			key ip
			events 100
			window 1h
		}
		zone z_strict {
			match {
				path /strict
			}
			key ip
			events 2
			window 1h
		}`))
	c := newClient(t)
	rs := sequence(t, c, 5, inst.URL("/strict"))
	wantCodes(t, "/strict", rs, 200, 200, 429, 429, 429)
	for i, r := range rs {
		loose := intParam(t, zoneParams(t, r, "RateLimit", "a_loose"), "r")
		strict := intParam(t, zoneParams(t, r, "RateLimit", "z_strict"), "r")
		wantLoose, wantStrict := int64(98), int64(0)
		if i < 2 {
			wantLoose, wantStrict = int64(99-i), int64(1-i)
		}
		if loose != wantLoose || strict != wantStrict {
			t.Errorf("request %d: a_loose r=%d, z_strict r=%d; want %d and %d", i+1, loose, strict, wantLoose, wantStrict)
		}
		// The single-valued headers describe the most restrictive zone.
		if got := intHeader(t, r, "X-RateLimit-Limit"); got != 2 {
			t.Errorf("request %d: X-RateLimit-Limit %d, want z_strict's 2", i+1, got)
		}
		if pol := fieldMembers(t, r, "RateLimit-Policy"); len(pol) != 2 {
			t.Errorf("request %d: RateLimit-Policy %q, want both zones", i+1, r.header.Get("RateLimit-Policy"))
		}
	}
	checkDenial(t, rs[2], "z_strict", 3500, 3600)

	other := get(t, c, inst.URL("/other"))
	if other.code != 200 {
		t.Fatalf("/other: status %d", other.code)
	}
	if got := intHeader(t, other, "X-RateLimit-Remaining"); got != 97 {
		t.Errorf("/other: a_loose remaining %d, want 97: the three refused requests took nothing", got)
	}
	if pol := fieldMembers(t, other, "RateLimit-Policy"); len(pol) != 1 || pol[0].zone != "a_loose" {
		t.Errorf("/other: RateLimit-Policy %q, want a_loose only", other.header.Get("RateLimit-Policy"))
	}
}

// TestHTTPKeys checks how requests are grouped: by client IP (through a
// trusted proxy), by header, by a composite template, and what a missing
// key does under each missing_key setting.
func TestHTTPKeys(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globals+`
http://{{http}} {
	rate_limit {
		zone by_api_key {
			key header X-API-Key
			events 2
			window 1h
		}
	}
	respond "ok"
}
http://{{http2}} {
	rate_limit {
		zone by_tenant_path {
			key {header.X-Tenant}:{path}
			events 2
			window 1h
			missing_key deny
		}
	}
	respond "ok"
}
http://{{http3}} {
	rate_limit {
		zone skip_missing {
			key header X-API-Key
			events 1
			window 1h
			missing_key skip
		}
	}
	respond "ok"
}
http://{{http4}} {
	rate_limit {
		zone by_ip {
			key ip
			events 2
			window 1h
		}
		zone by_net {
			match {
				path /net
			}
			key ip
			ipv4_prefix 24
			events 1
			window 1h
		}
	}
	respond "ok"
}
`)
	c := newClient(t)

	t.Run("header", func(t *testing.T) {
		url := inst.URL("/")
		wantCodes(t, "key k1", sequence(t, c, 3, url, "X-API-Key", "k1"), 200, 200, 429)
		wantCodes(t, "key k2", sequence(t, c, 3, url, "X-API-Key", "k2"), 200, 200, 429)
		// A key that equals the client IP is still a key of its own...
		wantCodes(t, "key 127.0.0.1", sequence(t, c, 3, url, "X-API-Key", "127.0.0.1"), 200, 200, 429)
		// ...and requests without the header are limited by IP apart from it.
		wantCodes(t, "no key (missing_key ip)", sequence(t, c, 3, url), 200, 200, 429)
	})

	t.Run("template", func(t *testing.T) {
		url := inst.URLOn("http2", "/a")
		wantCodes(t, "tenant t1 /a", sequence(t, c, 3, url, "X-Tenant", "t1"), 200, 200, 429)
		wantCodes(t, "tenant t1 /b", sequence(t, c, 1, inst.URLOn("http2", "/b"), "X-Tenant", "t1"), 200)
		wantCodes(t, "tenant t2 /a", sequence(t, c, 1, url, "X-Tenant", "t2"), 200)
		// Without the tenant the key is incomplete: missing_key deny.
		rs := sequence(t, c, 1, url)
		wantCodes(t, "no tenant (missing_key deny)", rs, 429)
		checkDenial(t, rs[0], "by_tenant_path", 1, 3600)
	})

	t.Run("skip", func(t *testing.T) {
		url := inst.URLOn("http3", "/")
		rs := sequence(t, c, 3, url)
		wantCodes(t, "no key (missing_key skip)", rs, 200, 200, 200)
		for _, r := range rs {
			if v := r.header.Get("RateLimit"); v != "" {
				t.Errorf("a skipped request carries RateLimit %q; no zone evaluated it", v)
			}
		}
		wantCodes(t, "key k1", sequence(t, c, 2, url, "X-API-Key", "k1"), 200, 429)
	})

	t.Run("ip", func(t *testing.T) {
		url := inst.URLOn("http4", "/")
		xff := "X-Forwarded-For"
		wantCodes(t, "client 192.0.2.1", sequence(t, c, 3, url, xff, "192.0.2.1"), 200, 200, 429)
		wantCodes(t, "client 192.0.2.2", sequence(t, c, 2, url, xff, "192.0.2.2"), 200, 200)
		wantCodes(t, "client 127.0.0.1", sequence(t, c, 2, url), 200, 200)
		// ipv4_prefix 24 groups a /24; by_ip (32 bits) still separates.
		net := inst.URLOn("http4", "/net")
		wantCodes(t, "198.51.100.1/24", sequence(t, c, 1, net, xff, "198.51.100.1"), 200)
		wantCodes(t, "198.51.100.200/24", sequence(t, c, 1, net, xff, "198.51.100.200"), 429)
		wantCodes(t, "198.51.101.1/24", sequence(t, c, 1, net, xff, "198.51.101.1"), 200)
	})
}

// TestHTTPLeakyBucketDelays: a leaky bucket holds concurrent requests so
// they leave 1/r apart, and refuses at once those that would wait longer
// than max_delay.
func TestHTTPLeakyBucketDelays(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, site(`		zone shaped {
			key ip
			algorithm leaky_bucket
			rate 10/s
			burst 1
			max_delay 1s
		}`))
	c := newClient(t)
	const n = 20
	const gap = 100 * time.Millisecond
	start := make(chan struct{})
	type result struct {
		r    response
		took time.Duration
		err  error
	}
	results := make(chan result, n)
	url := inst.URL("/")
	for range n {
		go func() {
			<-start
			t0 := time.Now()
			r, err := send(c, http.MethodGet, url)
			results <- result{r, time.Since(t0), err}
		}()
	}
	begin := time.Now()
	close(start)
	var admitted []time.Time
	var refusedTook []time.Duration
	for range n {
		res := <-results
		if res.err != nil {
			t.Fatal(res.err)
		}
		switch res.r.code {
		case http.StatusOK:
			admitted = append(admitted, res.r.done)
		case http.StatusTooManyRequests:
			refusedTook = append(refusedTook, res.took)
			// The queue is 1s deep: a refused request would wait just
			// beyond it, so it may retry within a second.
			if ra := intHeader(t, res.r, "Retry-After"); ra != 1 {
				t.Errorf("refused: Retry-After %d, want 1", ra)
			}
		default:
			t.Fatalf("status %d", res.r.code)
		}
	}
	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	t.Logf("%d admitted over %v, %d refused; refused answered within %v",
		len(admitted), admitted[len(admitted)-1].Sub(admitted[0]), len(refusedTook), slices.Max(append(refusedTook, 0)))
	// Waits of 0, 0.1s, ..., 1s fit in the queue: 11 requests, more only
	// if the burst itself took longer than a slot to arrive, as it may on
	// a loaded machine.
	if len(admitted) < 11 {
		t.Errorf("%d admitted, want at least 11 (waits of 0 to 1s)", len(admitted))
	}
	if len(refusedTook) == 0 {
		t.Fatal("no request refused: max_delay did not bound the queue")
	}
	// Admitted requests leave 1/r apart.
	span := admitted[len(admitted)-1].Sub(admitted[0])
	wantSpan := time.Duration(len(admitted)-1) * gap
	if span < wantSpan-150*time.Millisecond || span > wantSpan+600*time.Millisecond {
		t.Errorf("admitted requests finished over %v, want about %v (1/r apart)", span, wantSpan)
	}
	gaps := make([]time.Duration, len(admitted)-1)
	for i := range gaps {
		gaps[i] = admitted[i+1].Sub(admitted[i])
	}
	slices.Sort(gaps)
	if med := gaps[len(gaps)/2]; med < 50*time.Millisecond || med > 200*time.Millisecond {
		t.Errorf("median gap between admitted requests %v, want about %v (gaps %v)", med, gap, gaps)
	}
	// Refused requests are not held.
	if worst := slices.Max(refusedTook); worst > admitted[len(admitted)-1].Sub(begin) {
		t.Errorf("a refused request took %v, longer than the whole queue", worst)
	}
}

// reloadConfig is a one-zone config whose policy and response body vary
// between reloads.
func reloadConfig(events int, body string) string {
	return globals + fmt.Sprintf(`
http://{{http}} {
	rate_limit {
		zone kept {
			key ip
			events %d
			window 1h
		}
	}
	respond %q
}
`, events, body)
}

// TestHTTPReloadKeepsCounters: a reload through the admin API keeps a
// zone's counters when its name and policy are unchanged, and starts afresh
// when the policy changes.
func TestHTTPReloadKeepsCounters(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, reloadConfig(3, "v1"))
	c := newClient(t)
	url := inst.URL("/")
	wantRemaining(t, "before reload", sequence(t, c, 2, url), "kept", 2, 1)

	// Same zone, same policy, different config: the counters survive.
	if err := inst.Load(reloadConfig(3, "v2")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	rs := sequence(t, c, 2, url)
	wantCodes(t, "after a reload with the same policy", rs, 200, 429)
	if rs[0].body != "v2" {
		t.Fatalf("body %q: the reload did not take effect", rs[0].body)
	}
	wantRemaining(t, "after a reload with the same policy", rs, "kept", 0, 0)

	// A new policy for the zone: fresh counters.
	if err := inst.Load(reloadConfig(4, "v3")); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	rs = sequence(t, c, 1, url)
	wantCodes(t, "after a policy change", rs, 200)
	wantRemaining(t, "after a policy change", rs, "kept", 3)
}

// TestHTTPReloadRefusesBrokenConfig: a broken Caddyfile is refused by the
// admin API with an error that names the zone and the line, and the running
// config keeps serving with its counters.
func TestHTTPReloadRefusesBrokenConfig(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, reloadConfig(3, "v1"))
	c := newClient(t)
	url := inst.URL("/")
	wantRemaining(t, "before", sequence(t, c, 1, url), "kept", 2)

	good := reloadConfig(3, "v2")
	for _, tc := range []struct{ name, from, to, bad string }{
		{"negative events", "events 3", "events -1", "events -1"},
		{"unknown option", "window 1h", "window 1h\n\t\t\tbananas 3", "bananas 3"},
		{"rate with events", "window 1h", "rate 5/m", "rate 5/m"},
	} {
		cfg := strings.Replace(good, tc.from, tc.to, 1)
		line := lineOf(t, cfg, tc.bad)
		err := inst.Load(cfg)
		if err == nil {
			t.Errorf("%s: Load accepted:\n%s", tc.name, cfg)
			continue
		}
		if want := fmt.Sprintf("Caddyfile:%d", line); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error does not name %s: %v", tc.name, want, err)
		}
		if !strings.Contains(err.Error(), "kept") {
			t.Errorf("%s: error does not name the zone: %v", tc.name, err)
		}
	}
	rs := sequence(t, c, 3, url)
	wantCodes(t, "the old config after refused loads", rs, 200, 200, 429)
	wantRemaining(t, "the old config after refused loads", rs, "kept", 1, 0, 0)
}

// TestHTTPExampleAdapts: `caddy adapt` of Caddyfile.example, which the
// README's first command runs, gives JSON that `caddy run` loads and
// serves, rate limits included. A missing example fails the test.
func TestHTTPExampleAdapts(t *testing.T) {
	t.Parallel()
	const example = "../Caddyfile.example"
	if _, err := os.Stat(example); err != nil {
		t.Fatalf("the README's example config: %v", err)
	}
	cmd := exec.Command(caddyproc.Binary(t), "adapt", "--config", example, "--adapter", "caddyfile", "--validate")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, stderr.String())
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("caddy adapt output is not JSON: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"handler":"rate_limit"`) {
		t.Fatalf("adapted config has no rate_limit handler:\n%s", out)
	}
	// Run it on the harness's ports: the example's own (localhost:2019,
	// :8080) may be taken, and :8080 listens beyond loopback.
	cfg["admin"] = map[string]any{"listen": "{{admin}}"}
	servers := jsonPath(t, cfg, "apps", "http", "servers")
	if len(servers) != 1 {
		t.Fatalf("the example has %d servers; this test expects one", len(servers))
	}
	for _, s := range servers {
		s.(map[string]any)["listen"] = []string{"{{http}}"}
	}
	runnable, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inst := caddyproc.StartJSON(t, string(runnable))
	c := newClient(t)
	r := get(t, c, inst.URL("/"))
	if r.code != 200 {
		t.Fatalf("GET /: status %d\n%s", r.code, inst.Log())
	}
	if pol := fieldMembers(t, r, "RateLimit-Policy"); len(pol) == 0 {
		t.Errorf("GET /: no zone in RateLimit-Policy")
	}
}

// TestHTTPMetrics reads the decision counters from the admin endpoint's
// /metrics, where Caddy serves the registry they are registered on, and
// checks disable_metrics leaves them out.
func TestHTTPMetrics(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		extra := ""
		if disabled {
			extra = "\t\tdisable_metrics\n"
		}
		inst := caddyproc.Start(t, site(`		zone metered {
			key ip
			events 2
			window 1h
		}
		zone metered_dry {
			key ip
			events 1
			window 1h
			dry_run
		}
`+extra))
		c := newClient(t)
		wantCodes(t, "metered", sequence(t, c, 3, inst.URL("/")), 200, 200, 429)
		m := get(t, c, inst.Admin()+"/metrics")
		for _, line := range []string{
			`caddy_http_rate_limit_decisions_total{result="allowed",zone="metered"} 2`,
			`caddy_http_rate_limit_decisions_total{result="denied",zone="metered"} 1`,
			`caddy_http_rate_limit_decisions_total{result="allowed",zone="metered_dry"} 1`,
			`caddy_http_rate_limit_decisions_total{result="dry_run_denied",zone="metered_dry"} 1`,
		} {
			if has := strings.Contains(m.body, line); has == disabled {
				t.Errorf("disable_metrics=%v: /metrics has %q: %v", disabled, line, has)
			}
		}
	}
}

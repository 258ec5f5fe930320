package ratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Tests from a review of runtime overrides against the criteria.
// Each failed before its fix; its comment says how, and the test checks
// the behaviour that fixed it.

// TestOverrideDistinctLimitsBoundAtPut: the README promises "at
// most ... 1,000 distinct override limits per zone" and overrides.go that
// "overrides beyond it that need a new limit are refused when set". But
// checkOverride counts only the limits already *built*, and a memory
// zone's PUT builds none (limits are built on a key's first request, or at
// provisioning), so 1,001 PUTs of distinct limits are all answered 200.
// Once the keys' requests have built 1,000 limits, the 1,001st key - whose
// override the API accepted and lists - is silently decided by the zone's
// own limit (5/1h here) instead of its override (and, by applyOverride,
// still counted in override_decisions_total{action="limit"}).
func TestOverrideDistinctLimitsBoundAtPut(t *testing.T) {
	const name = "ov_acc_distinct"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 5/1h
		}
	}`)
	z := handlerZone(t, h, name)
	t.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
	const n = 1001
	ip := func(i int) string { return fmt.Sprintf("10.26.%d.%d", i/256, i%256) }
	accepted := 0
	for i := range n {
		code, body := adminOverride(t, http.MethodPut, name, ip(i), fmt.Sprintf(`{"limit": %d}`, 10+i))
		switch code {
		case 200:
			accepted++
		case 400:
			t.Logf("PUT %d refused: %s", i+1, body)
		default:
			t.Fatalf("PUT %d: %d %s", i+1, code, body)
		}
	}
	// Every accepted override must be what decides its key.
	for i := range accepted {
		r, _ := newKeyRequest(ip(i), nil)
		w, code := serve(h, r, okHandler)
		if want := strconv.Itoa(10 + i); code != 200 || w.Header().Get("X-RateLimit-Limit") != want {
			t.Fatalf("%d of %d PUTs of distinct limits were answered 200, but key #%d's request got %d with X-RateLimit-Limit %q, want its override's %s: the bound of %d distinct limits is not enforced when an override is set, and the accepted override is ignored",
				accepted, n, i+1, code, w.Header().Get("X-RateLimit-Limit"), want, maxOverrideLimits)
		}
	}
}

// TestOverrideRetryAfterCappedAtExpiry: a limit override that
// lowers a key's limit (1/1h in a zone of 100/1h) and expires in 10 s. Its
// second request is refused, told Retry-After: 3600 (and an
// X-RateLimit-Reset an hour away), although 10 s later the override has
// lapsed and the key is admitted by the zone. A block's Retry-After is
// capped at its expiry (blockFor); a limit override's refusal is not, so
// the client is told to wait an hour for what is 10 seconds.
func TestOverrideRetryAfterCappedAtExpiry(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clock := testutil.NewClock(start)
	h := provisionHandlerAt(t, `rate_limit {
		zone ov_acc_lim_exp {
			key ip
			algorithm fixed_window
			rate 100/1h
		}
	}`, clock)
	const ip = "198.51.100.161"
	setOverride(t, h, "ov_acc_lim_exp", ip, limiter.Override{Action: limiter.OverrideLimit, Events: 1, Expires: start.Add(10 * time.Second)})
	if code, _ := serveKey(h, ip, ""); code != 200 {
		t.Fatalf("first request under 1/1h: %d", code)
	}
	code, hdr := serveKey(h, ip, "")
	if code != 429 {
		t.Fatalf("second request under 1/1h: %d, want 429", code)
	}
	retry := hdr.Get("Retry-After")
	clock.Set(start.Add(10 * time.Second))
	after, _ := serveKey(h, ip, "")
	if n, _ := strconv.Atoi(retry); n > 10 {
		t.Fatalf("refused 10s before its override lapses with Retry-After %s (X-RateLimit-Reset %s, start %d); at the expiry the key is answered %d: Retry-After is not capped at the override's expiry",
			retry, hdr.Get("X-RateLimit-Reset"), start.Unix(), after)
	}
}

// TestOverrideExemptStripsResponseCost: a response_cost zone removes
// the cost header from the client's response unless `keep` (README: "also
// when the zone's Redis failed and fail open let the request through").
// For an exempt key the zone leaves the request entirely, so the
// upstream's X-Tokens reaches the client: the exemption changes what the
// zone strips, not only what it limits.
func TestOverrideExemptStripsResponseCost(t *testing.T) {
	const name = "ov_acc_exempt_cost"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 100/1h
			response_cost X-Tokens
		}
	}`)
	const plain, exempt = "198.51.100.171", "198.51.100.172"
	r, _ := newKeyRequest(plain, nil)
	if w, _ := serve(h, r, answer(200, "X-Tokens", "42")); w.Header().Get("X-Tokens") != "" {
		t.Fatalf("control: X-Tokens reached a key without override")
	}
	setOverride(t, h, name, exempt, limiter.Override{Action: limiter.OverrideExempt})
	r, _ = newKeyRequest(exempt, nil)
	w, code := serve(h, r, answer(200, "X-Tokens", "42"))
	if got := w.Header().Get("X-Tokens"); got != "" {
		t.Fatalf("exempt key: status %d, X-Tokens %q reached the client of a response_cost zone without keep", code, got)
	}
}

// TestOverridePutBodyTrailingDataRefused: the issue asks for 400 on a bad
// body. putOverride decodes only the first JSON value, so a body followed
// by anything - here a second object asking for a block - is answered 200
// and the first object is applied.
func TestOverridePutBodyTrailingDataRefused(t *testing.T) {
	const name, ip = "ov_acc_trailing", "198.51.100.181"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			rate 10/1m
		}
	}`)
	z := handlerZone(t, h, name)
	t.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
	code, body := adminOverride(t, http.MethodPut, name, ip, `{"limit": 5} {"action": "block"}`)
	if code != 400 {
		t.Fatalf("PUT of two JSON objects: %d %s, want 400 for a bad body", code, body)
	}
}

// TestOverrideBlockWithRequestCost: in a zone whose cost is a
// placeholder (`cost {http.request.header.X-Cost}`), a blocked key's
// request is answered 400 instead of 429: applyOverride points the
// candidate at the block's limit, whose maxCost is 0 (blockLimit never
// sets it), and requestCost then refuses any cost above 0 as one "the
// limit can never admit". The issue asks that a block answer 429 with an
// honest Retry-After.
func TestOverrideBlockWithRequestCost(t *testing.T) {
	const name, ip = "ov_acc_block_cost", "198.51.100.191"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 100/1h
			cost {http.request.header.X-Cost}
		}
	}`)
	setOverride(t, h, name, ip, limiter.Override{Action: limiter.OverrideBlock})
	r, _ := newKeyRequest(ip, map[string]string{"X-Cost": "3"})
	w, code := serve(h, r, okHandler)
	if code != 429 || w.Header().Get("Retry-After") != "3600" {
		t.Fatalf("blocked key with X-Cost: 3: status %d, Retry-After %q, want 429 and 3600", code, w.Header().Get("Retry-After"))
	}
}

// TestCLIInspectShowsOverride: `caddy rate-limit inspect`
// of an exempt key prints LIMIT 0, REMAINING 0, RESET AFTER 0s - the row
// of a key that has nothing left - because the API's answer for an
// exemption is zeros plus an "override" member, and the CLI's table has
// no column for the override and drops it. A blocked key reads the same
// way (0, 0, 1h). The operator is told the opposite of what the key's
// requests see (never limited). Run against the real admin routes.
func TestCLIInspectShowsOverride(t *testing.T) {
	const name, ip = "ov_acc_cli_ex", "198.51.100.201"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			rate 10/1m
		}
	}`)
	setOverride(t, h, name, ip, limiter.Override{Action: limiter.OverrideExempt})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := serveAdmin(w, r); err != nil {
			var ae caddy.APIError
			errors.As(err, &ae)
			w.WriteHeader(ae.HTTPStatus)
			_ = json.NewEncoder(w).Encode(ae)
		}
	}))
	defer srv.Close()
	api := &adminClient{addr: strings.TrimPrefix(srv.URL, "http://")}
	cmd := withTier(cliCommand("inspect", "", "", 2, cliInspect))
	var out bytes.Buffer
	if err := cliInspect(api, caddycmd.Flags{FlagSet: cmd.Flags()}, []string{name, ip}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	if !strings.Contains(out.String(), "exempt") {
		t.Fatalf("caddy rate-limit inspect of an exempt key prints no sign of the exemption:\n%s", out.String())
	}
}

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

// TestOverrideDistinctLimitsBoundAtPut: a zone holds at most 1,000
// distinct override limits, and the PUT that would need the 1,001st is
// refused with 400, so every override the API accepted decides its key.
// (Before its fix the bound counted only limits already built, on a
// key's first request: all 1,001 PUTs got 200, and the 1,001st key was
// silently decided by the zone's own limit.)
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

// TestOverrideRetryAfterCappedAtExpiry: a key under an override limit of
// 1/1h (the zone's is 100/1h) that expires in 10 s is refused with a
// Retry-After of at most those 10 s, and admitted by the zone once the
// override has lapsed. (Before its fix the refusal said Retry-After: 3600;
// only a block's wait was capped at its expiry.)
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
	if after != 200 {
		t.Fatalf("at the override's expiry: %d, want 200 from the zone's own limit", after)
	}
}

// TestOverrideExemptStripsResponseCost: a response_cost zone without
// `keep` removes the upstream's cost field from the client's response for
// an exempt key too: the exemption changes what the zone limits, not what
// it strips. (Before its fix the exempt key's response kept X-Tokens.)
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

// TestOverridePutBodyTrailingDataRefused: a PUT body with anything after
// its JSON object (here a second object asking for a block) is refused
// with 400. (Before its fix only the first object was read, answered 200
// and applied.)
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

// TestOverrideBlockWithRequestCost: in a zone whose cost is a placeholder
// (`cost {http.request.header.X-Cost}`), a blocked key's request is
// refused with 429 and an honest Retry-After whatever its cost. (Before
// its fix it got 400: the block's limit has no maxCost, and the cost was
// refused as one the limit could never admit.)
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

// TestCLIInspectShowsOverride: `caddy rate-limit inspect` of an exempt
// key says so in its OVERRIDE column, run against the real admin routes.
// (Before its fix the table dropped the API's override member and printed
// LIMIT 0, REMAINING 0: the row of a spent key, the opposite of what the
// key's requests see.)
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

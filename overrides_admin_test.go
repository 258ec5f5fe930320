package ratelimit

// Tests of the admin API's override writes: which PUTs it takes and
// refuses, and that a key it took an override for is then decided.

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestOverrideDistinctLimitsBoundAtPut: a zone holds at most 1,000
// distinct override limits, and the PUT that would need the 1,001st is
// refused with 400, so every override the API accepted decides its key.
// (The bug it guards against: the bound counted only limits already built, on a
// key's first request: all 1,001 PUTs got 200, and the 1,001st key was
// silently decided by the zone's own limit.)
func TestOverrideDistinctLimitsBoundAtPut(t *testing.T) {
	const name = "ov_distinct"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm fixed_window", "rate 5/1h")))
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

// TestOverridePutBodyTrailingDataRefused: a PUT body with anything after
// its JSON object (here a second object asking for a block) is refused
// with 400. (The bug it guards against: only the first object was read, answered 200
// and applied.)
func TestOverridePutBodyTrailingDataRefused(t *testing.T) {
	const name, ip = "ov_trailing", "198.51.100.181"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "rate 10/1m")))
	z := handlerZone(t, h, name)
	t.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
	code, body := adminOverride(t, http.MethodPut, name, ip, `{"limit": 5} {"action": "block"}`)
	if code != 400 {
		t.Fatalf("PUT of two JSON objects: %d %s, want 400 for a bad body", code, body)
	}
}

// TestOverrideExtremeBodiesNeverPanic: extreme but well-formed bodies on
// each algorithm are answered 200 or 400, and a request of the key is then
// decided without a panic or a 5xx. (leaky_bucket is left out only because it holds the
// requests it shapes, which makes the test slow.)
func TestOverrideExtremeBodiesNeverPanic(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "concurrency"} {
		name := "ov_bodies_" + alg
		rate := "rate 5/1m"
		if alg == "concurrency" {
			rate = "events 5"
		}
		h := provisionHandler(t, "rate_limit {\n zone "+name+" {\n  key ip\n  algorithm "+alg+"\n  "+rate+"\n }\n}")
		const ip = "198.51.100.91"
		for _, body := range []string{
			`{"limit": 9223372036854775807}`,
			`{"limit": 9223372036854775807, "window": "1ns"}`,
			`{"limit": 1, "window": "8760h"}`,
			`{"limit": 1, "burst": 9223372036854775807}`,
			`{"limit": 1, "expires": "2400-01-01T00:00:00Z"}`,
			`{"limit": 1, "expires": "1ns"}`,
			`{"action": "block", "expires": "1ms"}`,
			`{"limit": -1}`, `{}`, `null`, `[]`, `{"limit": 1.5}`,
		} {
			code, msg := adminOverride(t, http.MethodPut, name, ip, body)
			if code != 200 && code != 400 {
				t.Errorf("%s %s: %d %s", alg, body, code, msg)
			}
			r, _ := newKeyRequest(ip, nil)
			if _, c := serve(h, r, okHandler); c != 200 && c != 429 {
				t.Errorf("%s %s: request answered %d", alg, body, c)
			}
		}
		adminOverride(t, http.MethodDelete, name, ip, "")
	}
}

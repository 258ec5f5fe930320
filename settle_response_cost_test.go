package ratelimit

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestResponseCostHugeValueCountsAsQuota: a reported cost too large for an
// int64 is above the quota, so it counts as the quota, not as invalid.
func TestResponseCostHugeValueCountsAsQuota(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("cost_huge", "algorithm fixed_window", "rate 100/1h", "response_cost X-Tokens")))
	ip := "198.51.100.201"
	serveFrom(h, ip, answer(200, "X-Tokens", "99999999999999999999"))
	if _, code := serveFrom(h, ip, answer(200, "X-Tokens", "1")); code != http.StatusTooManyRequests {
		t.Fatalf("after a response reporting 99999999999999999999 (above the quota of 100): status %d, want 429 (charged the quota)", code)
	}
}

// TestResponseCostHeaderStrippedWhenStoreFailsOpen: the cost header is
// removed unless kept, also when the zone's store failed open and the
// zone decided nothing.
func TestResponseCostHeaderStrippedWhenStoreFailsOpen(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	h := provisionHandler(t, rateLimitConfig(zoneConfig("cost_open_tokens", "algorithm fixed_window", "rate 100/1h", "store redis", "fail open", "response_cost X-Tokens"), configBlock("redis", "addresses "+addr, "timeout 200ms")))
	w, code := serveFrom(h, "198.51.100.203", answer(200, "X-Tokens", "42"))
	if code != http.StatusOK {
		t.Fatalf("status %d, want 200 (fail open)", code)
	}
	if got := w.Header().Get("X-Tokens"); got != "" {
		t.Fatalf("X-Tokens %q reached the client of a response_cost zone without keep", got)
	}
}

// TestResponseCostAbortCountedMissing: a streamed response aborted before
// its cost trailer (reverse_proxy panics with http.ErrAbortHandler when
// the upstream or the client breaks off a stream) counts as missing.
func TestResponseCostAbortCountedMissing(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("cost_abort_tokens", "algorithm token_bucket", "rate 100/1h", "response_cost X-Tokens")))
	missing := h.zones[0].metrics.responseCosts[responseCostMissing]
	before := counterValue(t, missing)
	abortsStream := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Trailer", "X-Tokens")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("partial"))
		panic(http.ErrAbortHandler)
	})
	serveAborted(h, "198.51.100.205", abortsStream)
	if got := counterValue(t, missing) - before; got != 1 {
		t.Fatalf("response_costs_total{result=missing} grew by %v after a stream aborted before its trailer, want 1", got)
	}
}

// TestResponseCostSettles: the response's header is the final cost: the
// difference is taken or given back, and the header is removed unless
// kept; a missing or invalid value leaves the up-front cost.
func TestResponseCostSettles(t *testing.T) {
	for _, alg := range []string{"fixed_window", "token_bucket", "sliding_window_log", "sliding_window_counter"} {
		t.Run(alg, func(t *testing.T) {
			h := provisionHandler(t, rateLimitConfig(zoneConfig("tokens", "algorithm "+alg, "rate 100/1h", "cost 10", "response_cost X-Tokens")))
			ip := "198.51.100.46"
			peek := func() string {
				w, code := serveFrom(h, ip, answer(200, "X-Tokens", "10"))
				if code != 200 {
					t.Fatalf("peek: status %d", code)
				}
				return remainingIn(t, w.Header(), "tokens") // after taking 10
			}
			w, _ := serveFrom(h, ip, answer(200, "X-Tokens", "25"))
			if w.Header().Get("X-Tokens") != "" {
				t.Fatalf("X-Tokens reached the client")
			}
			// 25 spent; the next request shows 100-25-10.
			if got := peek(); got != "65" {
				t.Fatalf("remaining %s after a response of 25, want 65", got)
			}
			serveFrom(h, ip, answer(200, "X-Tokens", "4")) // takes 10, gives 6 back
			if got := peek(); got != "51" {
				t.Fatalf("remaining %s after a response of 4, want 51 (75-4-10-10)", got)
			}
			for _, v := range []string{"", "many", "-3"} {
				serveFrom(h, ip, answer(200, "X-Tokens", v)) // the up-front 10 stands
			}
			if got := peek(); got != "11" {
				t.Fatalf("remaining %s after three unread costs, want 11 (61-30-10-10)", got)
			}
		})
	}
}

// TestResponseCostDebt: a cost beyond what is left is taken all the same;
// the key owes and is refused until time repays it.
func TestResponseCostDebt(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("tokens", "algorithm fixed_window", "rate 100/1h", "response_cost X-Tokens keep")))
	ip := "198.51.100.47"
	w, _ := serveFrom(h, ip, answer(200, "X-Tokens", "90"))
	if w.Header().Get("X-Tokens") != "90" {
		t.Fatalf("keep: X-Tokens %q", w.Header().Get("X-Tokens"))
	}
	serveFrom(h, ip, answer(200, "X-Tokens", "100")) // 10 left, takes 100: owes 90
	if _, code := serveFrom(h, ip, answer(200, "X-Tokens", "1")); code != 429 {
		t.Fatalf("a key that owes: status %d, want 429", code)
	}
}

// TestResponseCostTrailer: a cost sent as a trailer after a streamed body
// settles as a header does, and is removed from the trailers and their
// announcement unless kept.
func TestResponseCostTrailer(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("tokens", "algorithm token_bucket", "rate 100/1h", "response_cost X-Tokens")))
	streams := func(announce bool) caddyhttp.Handler {
		return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if announce {
				w.Header().Set("Trailer", "X-Tokens, X-Other")
			}
			w.WriteHeader(200)
			_, _ = w.Write([]byte("chunk"))
			_ = http.NewResponseController(w).Flush()
			if announce {
				w.Header().Set("X-Tokens", "30")
			} else {
				w.Header().Set(http.TrailerPrefix+"X-Tokens", "30")
			}
			return nil
		})
	}
	ip := "198.51.100.48"
	for i, announce := range []bool{true, false} {
		w, _ := serveFrom(h, ip, streams(announce))
		if got := w.Header().Get("Trailer"); announce && got != "X-Other" {
			t.Errorf("Trailer %q, want X-Other alone", got)
		}
		if w.Header().Get("X-Tokens") != "" || w.Header().Get(http.TrailerPrefix+"X-Tokens") != "" {
			t.Errorf("the X-Tokens trailer reached the client: %v", w.Header())
		}
		w, _ = serveFrom(h, ip, answer(200, "X-Tokens", "0"))
		if got, want := remainingIn(t, w.Header(), "tokens"), fmt.Sprint(100-30*(i+1)-1); got != want {
			t.Fatalf("remaining %s after a trailer of 30, want %s", got, want)
		}
	}
}

// TestResponseCostFieldRemovedWhenZoneSkips: the upstream's response_cost
// field never reaches the client unless the zone keeps it, whatever path
// the zone took: a request without the key under `missing_key skip`, and
// a dry_run zone whose per-request cost is invalid, decide nothing in the
// zone but still lose its field. (Both paths returned before the field
// was marked for removal: X-Internal-Tokens: 17 reached the client.)
func TestResponseCostFieldRemovedWhenZoneSkips(t *testing.T) {
	cases := []struct {
		name, zone string
		headers    map[string]string
	}{
		{"missing key skipped", `zone rc_skip {
			key {http.request.header.X-Api-Key}
			missing_key skip
			rate 100/1h
			response_cost X-Internal-Tokens
		}`, nil},
		{"dry run with an invalid cost", `zone rc_dry_cost {
			rate 100/1h
			cost {http.request.header.X-Batch}
			response_cost X-Internal-Tokens
			dry_run
		}`, map[string]string{"X-Batch": "nope"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionHandler(t, "rate_limit {\n"+tc.zone+"\n}")
			r, _ := newKeyRequest("198.51.100.96", tc.headers)
			w, code := serve(h, r, answer(200, "X-Internal-Tokens", "17"))
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			if v := w.Header().Get("X-Internal-Tokens"); v != "" {
				t.Fatalf("X-Internal-Tokens: %s reached the client", v)
			}
		})
	}
}

// TestResponseCostSharedTrailerUndecidedZoneFirst: two zones read
// the same response_cost field; the first (in name order) decides nothing
// for the request (its key is missing under missing_key skip), the second
// admitted it. The cost comes in a trailer: the second zone must be
// settled by it (2, not the up-front 10) before the field is removed.
func TestResponseCostSharedTrailerUndecidedZoneFirst(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_ru_shared_user {
			key {http.request.header.X-Api-Key}
			missing_key skip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
		zone b_ru_shared_ip {
			key ip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
	}`)
	const ip = "198.51.100.197"
	for _, trailer := range []bool{false, true} {
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if !trailer {
				w.Header().Set("X-Tokens", "2")
			} else {
				w.Header().Set("Trailer", "X-Tokens")
			}
			w.WriteHeader(200)
			_, _ = w.Write([]byte("body"))
			if trailer {
				w.Header().Set("X-Tokens", "2")
			}
			return nil
		})
		if _, code := serveFrom(h, ip, next); code != 200 {
			t.Fatalf("trailer %v: %d", trailer, code)
		}
	}
	w, _ := serveFrom(h, ip, answer(200, "X-Tokens", "10"))
	if got := remainingIn(t, w.Header(), "b_ru_shared_ip"); got != "86" {
		t.Fatalf("b remaining %s after responses of 2 (header), 2 (trailer) and 10 up front, want 86 (the trailer's 2 was not read: 78)", got)
	}
}

// TestResponseCostSharedTrailerDecidedZones: two zones that both admitted the
// request read the same response_cost field, sent in a trailer: each is
// settled by it. The first removes the field after settling, before the
// second reads it.
func TestResponseCostSharedTrailerDecidedZones(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_ru_shared2_user {
			key ip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
		zone b_ru_shared2_ip {
			key ip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
	}`)
	const ip = "198.51.100.198"
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Trailer", "X-Tokens")
		w.WriteHeader(200)
		_, _ = w.Write([]byte("body"))
		w.Header().Set("X-Tokens", "2")
		return nil
	})
	if _, code := serveFrom(h, ip, next); code != 200 {
		t.Fatalf("first: %d", code)
	}
	w, _ := serveFrom(h, ip, answer(200, "X-Tokens", "10"))
	a, b := remainingIn(t, w.Header(), "a_ru_shared2_user"), remainingIn(t, w.Header(), "b_ru_shared2_ip")
	if a != "88" || b != "88" {
		t.Fatalf("remaining a %s b %s after a trailer of 2 and 10 up front, want 88 88", a, b)
	}
}

// TestResponseCostUndecidedZonesStripped: a zone that applies but decides
// nothing (exempt key, missing_key skip, store failed open) has its
// response_cost removed from the header, the Trailer announcement and the
// trailer, beside a zone that decided and settles by its own trailer.
func TestResponseCostUndecidedZonesStripped(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	cases := []struct{ name, zone string }{
		{"exempt", `zone a_ru_st_exempt {
			key ip
			rate 100/1h
			response_cost X-Tokens
		}`},
		{"skip", `zone a_ru_st_skip {
			key {http.request.header.X-Api-Key}
			missing_key skip
			rate 100/1h
			response_cost X-Tokens
		}`},
		{"open", `zone a_ru_st_open {
			key ip
			rate 100/1h
			store redis
			fail open
			response_cost X-Tokens
		}
		redis {
			addresses ` + addr + `
			timeout 100ms
		}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionHandler(t, `rate_limit {
				`+tc.zone+`
				zone b_ru_st_`+tc.name+` {
					key ip
					rate 100/1h
					cost 10
					response_cost X-Other
				}
			}`)
			const ip = "198.51.100.195"
			if tc.name == "exempt" {
				setOverride(t, h, "a_ru_st_exempt", ip, limiter.Override{Action: limiter.OverrideExempt})
			}
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				w.Header().Set("Trailer", "X-Tokens, X-Other, X-Kept")
				w.WriteHeader(200)
				_, _ = w.Write([]byte("body"))
				w.Header().Set("X-Tokens", "3")
				w.Header().Set("X-Other", "2")
				w.Header().Set("X-Kept", "1")
				return nil
			})
			for i := range 2 {
				w, code := serveFrom(h, ip, next)
				if code != 200 {
					t.Fatalf("#%d: %d", i, code)
				}
				hdr := w.Header()
				if hdr.Get("X-Tokens") != "" || hdr.Get("X-Other") != "" || hdr.Get("Trailer") != "X-Kept" || hdr.Get("X-Kept") != "1" {
					t.Fatalf("#%d: X-Tokens %q X-Other %q Trailer %q X-Kept %q", i, hdr.Get("X-Tokens"), hdr.Get("X-Other"), hdr.Get("Trailer"), hdr.Get("X-Kept"))
				}
				// b settled by its trailer: 2 per request.
				if got := remainingIn(t, hdr, "b_ru_st_"+tc.name); got != []string{"90", "88"}[i] {
					t.Fatalf("#%d: b remaining %s", i, got)
				}
			}
		})
	}
}

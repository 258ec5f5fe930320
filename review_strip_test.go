package ratelimit

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestReviewUndecidedTrailerStripped: a zone that applies but decides
// nothing (exempt key, missing_key skip, store failed open) has its
// response_cost removed from the header, the Trailer announcement and the
// trailer, beside a zone that decided and settles by its own trailer.
func TestReviewUndecidedTrailerStripped(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	cases := []struct{ name, zone string }{
		{"exempt", `zone a_rv_st_exempt {
			key ip
			rate 100/1h
			response_cost X-Tokens
		}`},
		{"skip", `zone a_rv_st_skip {
			key {http.request.header.X-Api-Key}
			missing_key skip
			rate 100/1h
			response_cost X-Tokens
		}`},
		{"open", `zone a_rv_st_open {
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
				zone b_rv_st_`+tc.name+` {
					key ip
					rate 100/1h
					cost 10
					response_cost X-Other
				}
			}`)
			const ip = "198.51.100.195"
			if tc.name == "exempt" {
				setOverride(t, h, "a_rv_st_exempt", ip, limiter.Override{Action: limiter.OverrideExempt})
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
				r, _ := newKeyRequest(ip, nil)
				w, code := serve(h, r, next)
				if code != 200 {
					t.Fatalf("#%d: %d", i, code)
				}
				hdr := w.Header()
				if hdr.Get("X-Tokens") != "" || hdr.Get("X-Other") != "" || hdr.Get("Trailer") != "X-Kept" || hdr.Get("X-Kept") != "1" {
					t.Fatalf("#%d: X-Tokens %q X-Other %q Trailer %q X-Kept %q", i, hdr.Get("X-Tokens"), hdr.Get("X-Other"), hdr.Get("Trailer"), hdr.Get("X-Kept"))
				}
				// b settled by its trailer: 2 per request.
				if got := remainingIn(t, hdr, "b_rv_st_"+tc.name); got != []string{"90", "88"}[i] {
					t.Fatalf("#%d: b remaining %s", i, got)
				}
			}
		})
	}
}

package ratelimit

import (
	"testing"
)

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

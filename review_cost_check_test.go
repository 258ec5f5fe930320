package ratelimit

import (
	"net/http"
	"testing"
)

// TestReviewBlockedThenBadCost: the README: every zone that applies has its
// cost checked before any zone decides, so a bad cost is answered 400 even
// when another zone would have refused the request; here the other zone
// refuses a missing key (missing_key deny).
func TestReviewBlockedThenBadCost(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_rv_deny {
			key {http.request.header.X-Key}
			missing_key deny
			rate 10/1h
		}
		zone b_rv_badcost {
			key ip
			rate 10/1h
			cost {http.request.header.X-Cost}
		}
	}`)
	r, _ := newKeyRequest("198.51.100.163", map[string]string{"X-Cost": "abc"})
	if _, code := serve(h, r, okHandler); code != http.StatusBadRequest {
		t.Fatalf("missing key under deny, bad cost in a later zone: %d, want 400", code)
	}
}

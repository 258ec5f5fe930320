package ratelimit

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestReviewUndecidedZoneKeepsSharedTrailerForLaterZone: two zones read
// the same response_cost field; the first (in name order) decides nothing
// for the request (its key is missing under missing_key skip), the second
// admitted it. The cost comes in a trailer: the second zone must be
// settled by it (2, not the up-front 10) before the field is removed.
func TestReviewUndecidedZoneKeepsSharedTrailerForLaterZone(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_rv_shared_user {
			key {http.request.header.X-Api-Key}
			missing_key skip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
		zone b_rv_shared_ip {
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
		r, _ := newKeyRequest(ip, nil)
		if _, code := serve(h, r, next); code != 200 {
			t.Fatalf("trailer %v: %d", trailer, code)
		}
	}
	r, _ := newKeyRequest(ip, nil)
	w, _ := serve(h, r, answer(200, "X-Tokens", "10"))
	if got := remainingIn(t, w.Header(), "b_rv_shared_ip"); got != "86" {
		t.Fatalf("b remaining %s after responses of 2 (header), 2 (trailer) and 10 up front, want 86 (the trailer's 2 was not read: 78)", got)
	}
}

// TestReviewDecidedZonesShareTrailer: two zones that both admitted the
// request read the same response_cost field, sent in a trailer: each is
// settled by it. The first removes the field after settling, before the
// second reads it.
func TestReviewDecidedZonesShareTrailer(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_rv_shared2_user {
			key ip
			rate 100/1h
			cost 10
			response_cost X-Tokens
		}
		zone b_rv_shared2_ip {
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
	r, _ := newKeyRequest(ip, nil)
	if _, code := serve(h, r, next); code != 200 {
		t.Fatalf("first: %d", code)
	}
	r, _ = newKeyRequest(ip, nil)
	w, _ := serve(h, r, answer(200, "X-Tokens", "10"))
	a, b := remainingIn(t, w.Header(), "a_rv_shared2_user"), remainingIn(t, w.Header(), "b_rv_shared2_ip")
	if a != "88" || b != "88" {
		t.Fatalf("remaining a %s b %s after a trailer of 2 and 10 up front, want 88 88", a, b)
	}
}

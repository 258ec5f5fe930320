package ratelimit

// The edges of settling by the response that a review found broken (each
// test failed before its fix): values no int64 holds, dry_run, a store
// that fails open, and handlers that abort.

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestResponseCostHugeValueCountsAsQuota: a reported cost too large for an
// int64 is above the quota, so it counts as the quota, not as invalid.
func TestResponseCostHugeValueCountsAsQuota(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone rv_huge {
			algorithm fixed_window
			rate 100/1h
			response_cost X-Tokens
		}
	}`)
	ip := "198.51.100.201"
	r, _ := newKeyRequest(ip, nil)
	serve(h, r, answer(200, "X-Tokens", "99999999999999999999"))
	r, _ = newKeyRequest(ip, nil)
	if _, code := serve(h, r, answer(200, "X-Tokens", "1")); code != http.StatusTooManyRequests {
		t.Fatalf("after a response reporting 99999999999999999999 (above the quota of 100): status %d, want 429 (charged the quota)", code)
	}
}

// TestDryRunBadCostNeverRefuses: a dry_run zone whose cost placeholder is
// missing or invalid lets the request through (dry_run never refuses,
// whatever else the zone says), counting it as dry_run_denied.
func TestDryRunBadCostNeverRefuses(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone rv_dry_cost {
			algorithm fixed_window
			rate 10/1h
			cost {http.request.header.X-Batch-Size}
			dry_run
		}
	}`)
	for _, v := range []string{"<none>", "abc", "11"} {
		hdr := map[string]string{}
		if v != "<none>" {
			hdr["X-Batch-Size"] = v
		}
		r, _ := newKeyRequest("198.51.100.202", hdr)
		if _, code := serve(h, r, okHandler); code != http.StatusOK {
			t.Errorf("dry_run zone, cost %q: status %d, want 200 (dry_run never refuses)", v, code)
		}
	}
}

// TestResponseCostHeaderStrippedWhenStoreFailsOpen: the cost header is
// removed unless kept, also when the zone's store failed open and the
// zone decided nothing.
func TestResponseCostHeaderStrippedWhenStoreFailsOpen(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	h := provisionHandler(t, `rate_limit {
		zone rv_open_tokens {
			algorithm fixed_window
			rate 100/1h
			store redis
			fail open
			response_cost X-Tokens
		}
		redis {
			addresses `+addr+`
			timeout 200ms
		}
	}`)
	r, _ := newKeyRequest("198.51.100.203", nil)
	w, code := serve(h, r, answer(200, "X-Tokens", "42"))
	if code != http.StatusOK {
		t.Fatalf("status %d, want 200 (fail open)", code)
	}
	if got := w.Header().Get("X-Tokens"); got != "" {
		t.Fatalf("X-Tokens %q reached the client of a response_cost zone without keep", got)
	}
}

// TestCountResponseAbortedNotCounted: a request whose handler aborts before
// writing a response (a panic, which net/http turns into a closed
// connection; reverse_proxy panics with http.ErrAbortHandler) matched no
// status, so its unit is given back.
func TestCountResponseAbortedNotCounted(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone rv_abort {
			algorithm fixed_window
			rate 2/1h
			count_response {
				status 401
			}
		}
	}`)
	aborts := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		panic(http.ErrAbortHandler)
	})
	ip := "198.51.100.204"
	for range 2 {
		func() {
			defer func() { _ = recover() }()
			r, _ := newKeyRequest(ip, nil)
			serve(h, r, aborts)
		}()
	}
	r, _ := newKeyRequest(ip, nil)
	w, code := serve(h, r, answer(200))
	if code != http.StatusOK {
		t.Fatalf("after two aborted requests (no 401 answered): status %d, want 200", code)
	}
	if got := remainingIn(t, w.Header(), "rv_abort"); got != "1" {
		t.Fatalf("remaining %s, want 1 (only this request's up-front unit)", got)
	}
}

// TestResponseCostAbortCountedMissing: a streamed response aborted before
// its cost trailer (reverse_proxy panics with http.ErrAbortHandler when
// the upstream or the client breaks off a stream) counts as missing.
func TestResponseCostAbortCountedMissing(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone rv_abort_tokens {
			algorithm token_bucket
			rate 100/1h
			response_cost X-Tokens
		}
	}`)
	missing := h.zones[0].metrics.responseCosts[responseCostMissing]
	before := counterValue(t, missing)
	aborts := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Trailer", "X-Tokens")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("partial"))
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() { _ = recover() }()
		r, _ := newKeyRequest("198.51.100.205", nil)
		serve(h, r, aborts)
	}()
	if got := counterValue(t, missing) - before; got != 1 {
		t.Fatalf("response_costs_total{result=missing} grew by %v after a stream aborted before its trailer, want 1", got)
	}
}

// TestCountResponseSettlesAcrossReload: a request admitted by a config
// that a reload replaces while it runs settles into the state the new
// config shares (same zone, same limit): its unit comes back once its
// response does not match, though its handler was cleaned up meanwhile.
func TestCountResponseSettlesAcrossReload(t *testing.T) {
	const cfg = `rate_limit {
		zone reload_logins {
			algorithm fixed_window
			rate 3/1h
			count_response {
				status 401
			}
		}
	}`
	old := provisionHandler(t, cfg)
	ip := "198.51.100.206"
	arrived, release, done := make(chan struct{}), make(chan struct{}), make(chan int)
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusOK)
		return nil
	})
	go func() {
		r, _ := newKeyRequest(ip, nil)
		_, code := serve(old, r, held)
		done <- code
	}()
	<-arrived
	newer := provisionHandler(t, cfg)
	r, _ := newKeyRequest(ip, nil)
	w, _ := serve(newer, r, answer(200))
	if got := remainingIn(t, w.Header(), "reload_logins"); got != "1" {
		t.Fatalf("remaining %s while the old config's request holds its unit, want 1", got)
	}
	_ = old.Cleanup()
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the held request: status %d", code)
	}
	r, _ = newKeyRequest(ip, nil)
	w, _ = serve(newer, r, answer(200))
	if got := remainingIn(t, w.Header(), "reload_logins"); got != "2" {
		t.Fatalf("remaining %s after the held request's 200 settled, want 2 (its unit given back)", got)
	}
}

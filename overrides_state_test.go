package ratelimit

// Tests of a key's state when its override changes: the same limit set
// again keeps the state, a new one starts it afresh, and a request
// admitted before the change settles into the state it was taken from.

import (
	"net/http"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// genZone provisions a memory zone name of 10/1h by fixed window, keyed
// by IP, and removes ip's override when the test ends.
func genZone(t *testing.T, name, ip string) *Handler {
	t.Helper()
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm fixed_window", "rate 10/1h")))
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
	return h
}

// TestOverrideSameLimitSpeltOutKeepsState: in a zone of 10/1h, the
// override {"limit": 2} and {"limit": 2, "window": "1h"} are one limit, 2
// an hour, and so is one whose burst or period is the zone's own: set
// again so, the key keeps its state, which has spent its 2. (The bug it
// guards against: the generation was kept only for an override written alike,
// and the key was admitted 2 more within the hour.)
func TestOverrideSameLimitSpeltOutKeepsState(t *testing.T) {
	const name, ip = "ov_same_limit", "198.51.100.124"
	h := genZone(t, name, ip)
	put := func(body string) {
		t.Helper()
		if code, msg := adminOverride(t, http.MethodPut, name, ip, body); code != 200 {
			t.Fatalf("PUT %s: %d %s", body, code, msg)
		}
	}
	put(`{"limit": 2}`)
	for i := range 2 {
		if code := serveIP(h, ip); code != 200 {
			t.Fatalf("request %d under 2/1h: %d", i+1, code)
		}
	}
	if code := serveIP(h, ip); code != 429 {
		t.Fatalf("third request under 2/1h: %d, want 429", code)
	}
	put(`{"limit": 2, "window": "1h"}`)
	if code := serveIP(h, ip); code != 429 {
		t.Fatalf("after setting the same 2/1h with its window spelt out: %d, want 429 (the key's state started afresh)", code)
	}
	put(`{"limit": 2, "window": "60m", "expires": "1h"}`)
	if code := serveIP(h, ip); code != 429 {
		t.Fatalf("after giving the same limit an expiry: %d, want 429", code)
	}
	put(`{"limit": 2, "window": "30m"}`)
	if code := serveIP(h, ip); code != 200 {
		t.Fatalf("under a new limit, 2 per 30m: %d, want 200 (a new limit starts afresh)", code)
	}
}

// TestOverrideConcurrentPutsOfOneLimit: eight PUTs of one new limit (2 an
// hour, replacing 1 an hour the key has spent) race requests of the key.
// The first write starts the key afresh and the others, the same limit,
// keep its state, since each decides its generation by the override the
// table holds where it writes: at most 2 requests are admitted. (The bug it
// guards against, seen by running two PUTs' steps in that order by hand: a PUT read
// the override in force before it wrote, so PUTs that both read the old
// limit each started the key afresh, 4 admitted under a limit of 2. The
// steps are now one, under the table's lock, which
// TestOverrideTablePutWithinKeepsGen checks without a race; this test is
// the stress of it through the admin API.)
func TestOverrideConcurrentPutsOfOneLimit(t *testing.T) {
	const name, ip = "ov_concurrent_puts", "198.51.100.125"
	for round := range 20 {
		h := genZone(t, name, ip)
		if code, msg := adminOverride(t, http.MethodPut, name, ip, `{"limit": 1}`); code != 200 {
			t.Fatalf("PUT L1: %d %s", code, msg)
		}
		if code := serveIP(h, ip); code != 200 {
			t.Fatalf("round %d: the one request under L1: %d", round, code)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				if code, msg := adminOverride(t, http.MethodPut, name, ip, `{"limit": 2}`); code != 200 {
					t.Errorf("PUT L2: %d %s", code, msg)
				}
			})
		}
		admitted := 0
		close(start)
		for range 40 {
			if serveIP(h, ip) == 200 {
				admitted++
			}
		}
		wg.Wait()
		for range 3 {
			if serveIP(h, ip) == 200 {
				admitted++
			}
		}
		if admitted > 2 {
			t.Fatalf("round %d: eight PUTs of limit 2 at once: %d admitted, want at most 2", round, admitted)
		}
		adminOverride(t, http.MethodDelete, name, ip, "")
	}
}

// TestOverrideRefundAfterFreshState: a request A admitted under override
// L2 (2 an hour) is still running when the operator sets L1 and then L2
// again, which starts L2 afresh. B and C then spend the fresh L2. A's
// response is not counted (count_response counts 5xx only), so A's unit
// is given back, but it was taken from the state L2 had before it
// started afresh, not from the fresh one: given back there, it would let
// D through, 3 counted requests under a limit of 2.
func TestOverrideRefundAfterFreshState(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			name := "ov_fresh_" + alg
			h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm "+alg, "rate 10/1h", "count_response {", "status 5xx", "}")))
			const ip = "198.51.100.91"
			t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
			put := func(body string) {
				t.Helper()
				if code, msg := adminOverride(t, http.MethodPut, name, ip, body); code != 200 {
					t.Fatalf("PUT %s: %d %s", body, code, msg)
				}
			}
			// respond answers with status once release is closed, telling
			// admitted first.
			respond := func(status int, admitted chan<- struct{}, release <-chan struct{}) caddyhttp.Handler {
				return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					admitted <- struct{}{}
					<-release
					w.WriteHeader(status)
					return nil
				})
			}
			put(`{"limit": 2, "window": "1h"}`)
			admitted, release, done := make(chan struct{}, 1), make(chan struct{}), make(chan int, 1)
			go func() {
				r, _ := newKeyRequest(ip, nil)
				_, code := serve(h, r, respond(200, admitted, release))
				done <- code
			}()
			select {
			case <-admitted:
			case code := <-done:
				t.Fatalf("A under L2: %d", code)
			}
			put(`{"limit": 1, "window": "1h"}`)
			put(`{"limit": 2, "window": "1h"}`)
			counted := func(who string) int {
				a, rel := make(chan struct{}, 1), make(chan struct{})
				close(rel)
				r, _ := newKeyRequest(ip, nil)
				_, code := serve(h, r, respond(500, a, rel))
				return code
			}
			for _, who := range []string{"B", "C"} {
				if code := counted(who); code != 500 {
					t.Fatalf("%s under the fresh L2: %d, want 500 (admitted, counted)", who, code)
				}
			}
			close(release)
			if code := <-done; code != 200 {
				t.Fatalf("A: %d", code)
			}
			if code := counted("D"); code != 429 {
				t.Fatalf("D after B and C spent the fresh L2 of 2: %d, want 429 (A's uncounted unit was given back into the fresh state)", code)
			}
		})
	}
}

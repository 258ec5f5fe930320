package ratelimit

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/delayproxy"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestResetIsOneForEveryHandlerOfAZone: when two handlers of one process
// declare a leased Redis zone, an admin reset of a key is one reset for
// both near caches. Handler A reaches Redis directly, B through a proxy
// 100 ms each way, so B's store reset reaches Redis about 100 ms after
// A's. A's requests during the reset, after A's store reset, lease units
// from the state B's store reset then erases (leases of 1, 2 and 4: 3
// unspent). Once the reset has returned, A must admit the fresh limit of
// 10 and no more. (When each handler's near cache was reset alone, one
// after the other, A kept those 3 units and spent them beside the fresh
// 10: 13 in the window. The handler-level model's race step found it,
// its three instances being handlers of one process.)
func TestResetIsOneForEveryHandlerOfAZone(t *testing.T) {
	srv := redistest.Start(t)
	px, err := delayproxy.Start(srv.Addr(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	const name, limit = "reset_two_handlers", 10
	config := func(addr string) string {
		return rateLimitConfig(
			zoneConfig(name, "key {http.request.header.X-Key}", "algorithm fixed_window", "rate 10/1m", "store redis", "local_quota 0.5"),
			redisConfig(addr, "timeout 5s"))
	}
	a := provisionHandler(t, config(srv.Addr()))
	b := provisionHandler(t, config(px.Addr()))
	send := func(h *Handler, key string) int {
		code, _ := servePlan(h, "198.51.100.31", "", map[string]string{"X-Key": key})
		return code
	}
	if code := send(b, "warm"); code != http.StatusOK { // B's connection, through the proxy
		t.Fatalf("B's first request: %d", code)
	}
	// All in one window of the minute.
	if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left < 5*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
	type answer struct {
		code int
		body string
	}
	reset := make(chan answer, 1)
	go func() {
		code, body := adminReset(t, name, "k")
		reset <- answer{code, body}
	}()
	// A's reset is over within milliseconds; B's store reset reaches
	// Redis some 100 ms after it.
	time.Sleep(20 * time.Millisecond)
	var during []int
	for range 4 {
		during = append(during, send(a, "k"))
	}
	got := <-reset
	if got.code != http.StatusOK {
		t.Fatalf("reset: %d %s", got.code, got.body)
	}
	var answers []keyReset
	if err := json.Unmarshal([]byte(got.body), &answers); err != nil || len(answers) != 2 {
		t.Fatalf("reset answered %s (%v), want one answer per handler", got.body, err)
	}
	admitted := 0
	for range 3 * limit {
		if send(a, "k") == http.StatusOK {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("after the reset A admitted %d in the window, want the fresh limit %d (during the reset: %v)", admitted, limit, during)
	}
}

// TestResetDropsGiveBackOfRequestInFlight: a request admitted before an
// admin reset of its key and still running at it, whose response is then
// not counted (count_response), gives its unit back naming the state
// that took it, which the reset erased: the fresh state, which never
// counted it, is not credited, and the key admits its limit after the
// reset, not one request more. For the memory store and Redis (where
// the zone leases, the near cache sends the give-back to Redis, its lease
// forgotten by the reset).
func TestResetDropsGiveBackOfRequestInFlight(t *testing.T) {
	srv := redistest.Start(t)
	for _, alg := range []string{"token_bucket", "sliding_window_log"} {
		for _, store := range []string{"memory", "redis"} {
			t.Run(alg+"/"+store, func(t *testing.T) {
				name := "reset_in_flight_" + alg + "_" + store
				opts := []string{"key {http.request.header.X-Key}", "algorithm " + alg, "rate 3/1h", "count_response {", "status 401", "}"}
				var blocks []string
				if store == "redis" {
					opts = append(opts, "store redis", "local_quota 0.5")
					blocks = append(blocks, redisConfig(srv.Addr(), "timeout 5s"))
				}
				h := provisionHandler(t, rateLimitConfig(append([]string{zoneConfig(name, opts...)}, blocks...)...))
				key := map[string]string{"X-Key": "k"}
				send := func() int {
					r, _ := newKeyRequest("198.51.100.32", key)
					_, code := serve(h, r, answer(401))
					return code
				}
				held := holdKey(h, "198.51.100.32", key)
				if code := <-held.admitted; code != 200 {
					t.Fatalf("the held request: %d", code)
				}
				if code, body := adminReset(t, name, "k"); code != http.StatusOK {
					t.Fatalf("reset: %d %s", code, body)
				}
				for i := range 3 {
					if code := send(); code != 401 {
						t.Fatalf("request %d after the reset: %d, want 401 (admitted, counted)", i+1, code)
					}
				}
				// The held request's 200 does not match count_response:
				// its unit comes back, to the state the reset erased.
				finish(held)
				if code := send(); code != http.StatusTooManyRequests {
					t.Errorf("after the held request ended: %d, want 429: the fresh state admitted its 3 and never counted the held request's unit", code)
				}
			})
		}
	}
}

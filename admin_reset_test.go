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

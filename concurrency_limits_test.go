package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// concurrencyConfig returns the config of a concurrency zone name, keyed
// by client IP, in store (a redis zone on a server of its own, started
// once), for a given limit: a test that reloads calls it twice.
func concurrencyConfig(t *testing.T, name, store string) func(events int) string {
	t.Helper()
	redisBlock := ""
	if store == storeRedis {
		redisBlock = "redis {\n url redis://" + redistest.Start(t).Addr() + "\n timeout 1s\n}"
	}
	return func(events int) string {
		return `rate_limit {
			zone ` + name + ` {
				key ip
				algorithm concurrency
				events ` + strconv.Itoa(events) + `
				store ` + store + `
			}
			` + redisBlock + `
		}`
	}
}

// concurrencyOverrideHandler provisions concurrencyConfig's zone with a
// limit of events.
func concurrencyOverrideHandler(t *testing.T, name, store string, events int) *Handler {
	t.Helper()
	return provisionHandler(t, concurrencyConfig(t, name, store)(events))
}

// TestConcurrencyOverrideCountsRequestsInFlight: a concurrency key has one
// set of requests in flight whatever limit counts them. Under an override
// of 1, A runs; the override becomes 2: one more runs, not two. With the
// zone's limit of 1 and A running, an override of 1 admits nothing more.
// (Each override limit was a store of its own, so the running requests
// were counted nowhere the new limit looked: 3 in flight under 2, and 2
// under 1.)
func TestConcurrencyOverrideCountsRequestsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const ip = "198.51.100.91"
		name := "conc_ov_change_" + store
		h := concurrencyOverrideHandler(t, name, store, 5)
		t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
		if code, body := adminOverride(t, http.MethodPut, name, ip, `{"limit": 1}`); code != 200 {
			t.Fatalf("PUT 1: %d %s", code, body)
		}
		a := holdKey(h, ip, nil)
		if code := <-a.admitted; code != 200 {
			t.Fatalf("A under an override of 1: %d", code)
		}
		if code, body := adminOverride(t, http.MethodPut, name, ip, `{"limit": 2}`); code != 200 {
			t.Fatalf("PUT 2: %d %s", code, body)
		}
		b := holdKey(h, ip, nil)
		if code := <-b.admitted; code != 200 {
			t.Fatalf("B under 2 with A in flight: %d", code)
		}
		c := holdKey(h, ip, nil)
		code := <-c.admitted
		finish(a, b, c)
		if code != 429 {
			t.Fatalf("C with A and B in flight under an override of 2: %d, want 429", code)
		}

		name1 := "conc_ov_set_" + store
		h1 := concurrencyOverrideHandler(t, name1, store, 1)
		t.Cleanup(func() { adminOverride(t, http.MethodDelete, name1, ip, "") })
		a = holdKey(h1, ip, nil)
		if code := <-a.admitted; code != 200 {
			t.Fatalf("A under the zone's 1: %d", code)
		}
		if code, body := adminOverride(t, http.MethodPut, name1, ip, `{"limit": 1}`); code != 200 {
			t.Fatalf("PUT 1: %d %s", code, body)
		}
		b = holdKey(h1, ip, nil)
		code = <-b.admitted
		finish(a, b)
		if code != 429 {
			t.Fatalf("B with A in flight, override of 1 set while A runs: %d, want 429", code)
		}
		// Once both finished, the key runs one at a time again.
		a = holdKey(h1, ip, nil)
		first := <-a.admitted
		b = holdKey(h1, ip, nil)
		second := <-b.admitted
		finish(a, b)
		if first != 200 || second != 429 {
			t.Fatalf("after the overlap: %d then %d, want 200 then 429", first, second)
		}
	})
}

// TestConcurrencyCostZeroHoldsASlot: a concurrency zone with a cost
// placeholder counts a cost of 0 as 1, so a request always holds a slot
// while it runs and no client can run more than the limit at once. (A
// cost of 0 took a unit and gave it back at once: 21 requests ran at once
// under a limit of 1.)
func TestConcurrencyCostZeroHoldsASlot(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("conc_cost0", "key ip", "algorithm concurrency", "events 1", "cost {http.request.header.X-Cost}")))
	const ip = "198.51.100.92"
	zero := map[string]string{"X-Cost": "0"}
	a := holdKey(h, ip, zero)
	if code := <-a.admitted; code != 200 {
		t.Fatalf("first request of cost 0: %d", code)
	}
	b := holdKey(h, ip, zero)
	zeroAgain := <-b.admitted
	c := holdKey(h, ip, map[string]string{"X-Cost": "1"})
	one := <-c.admitted
	finish(a, b, c)
	if zeroAgain != 429 || one != 429 {
		t.Fatalf("with a request of cost 0 in flight under 1: cost 0 got %d, cost 1 got %d; want 429 and 429", zeroAgain, one)
	}
	// Its slot is given back when it finishes.
	d := holdKey(h, ip, zero)
	code := <-d.admitted
	finish(d)
	if code != 200 {
		t.Fatalf("after every request finished: %d, want 200", code)
	}
}

// resetKeyOf forgets key's state in zone name through the admin API.
func resetKeyOf(t *testing.T, name, key string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodDelete, adminPrefix+"zones/"+url.PathEscape(name)+"?key="+url.QueryEscape(key), nil)
	w := httptest.NewRecorder()
	if err := serveAdmin(w, r); err != nil || w.Code != http.StatusOK {
		t.Fatalf("reset %s of %s: %d %v", key, name, w.Code, err)
	}
}

// TestConcurrencyResetForgetsRequestsInFlight: an admin reset forgets the
// requests a concurrency key has in flight, and their slots never come
// back into the state that follows it: A runs under a limit of 1, the key
// is reset, B runs, A finishes; C is refused while B runs. (In memory,
// A's release was subtracted from the count that began with the reset,
// and C ran beside B under a limit of 1.)
func TestConcurrencyResetForgetsRequestsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const ip = "198.51.100.94"
		name := "conc_reset_" + store
		h := concurrencyOverrideHandler(t, name, store, 1)
		a := holdKey(h, ip, nil)
		if code := <-a.admitted; code != 200 {
			t.Fatalf("A: %d", code)
		}
		resetKeyOf(t, name, ip)
		b := holdKey(h, ip, nil)
		if code := <-b.admitted; code != 200 {
			t.Fatalf("B after the reset: %d", code)
		}
		finish(a)
		c := holdKey(h, ip, nil)
		code := <-c.admitted
		finish(b, c)
		if code != 429 {
			t.Fatalf("C with B in flight, after A (from before the reset) finished: %d, want 429", code)
		}
	})
}

// TestConcurrencyReloadCountsRequestsInFlight: a reload that lowers a
// concurrency zone's limit counts the requests the replaced config still
// runs: with two in flight on the old handler (limit 2), the new one
// (limit 1) admits nothing until both finished, and then one at a time.
// (A memory store was pooled by its limit: the new limit began at 0 in
// flight, and ran a third request beside the two.)
func TestConcurrencyReloadCountsRequestsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const ip = "198.51.100.95"
		name := "conc_reload_" + store
		config := concurrencyConfig(t, name, store)
		old := provisionHandler(t, config(2))
		a, b := holdKey(old, ip, nil), holdKey(old, ip, nil)
		if ca, cb := <-a.admitted, <-b.admitted; ca != 200 || cb != 200 {
			t.Fatalf("A and B under 2: %d %d", ca, cb)
		}
		reloaded := provisionHandler(t, config(1))
		_ = old.Cleanup()
		c := holdKey(reloaded, ip, nil)
		code := <-c.admitted
		finish(c)
		finish(a)
		d := holdKey(reloaded, ip, nil)
		withB := <-d.admitted
		finish(d, b)
		e := holdKey(reloaded, ip, nil)
		alone := <-e.admitted
		finish(e)
		if code != 429 || withB != 429 || alone != 200 {
			t.Fatalf("under the reloaded limit of 1: %d with A and B in flight, %d with B, %d alone; want 429, 429, 200", code, withB, alone)
		}
	})
}

package ratelimit

// Tests of overrides on concurrency zones, whose state is the requests in
// flight: a changed or lapsed override keeps the slots they hold.

import (
	"net/http"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestOverrideConcurrencyExpiryKeepsSlotsInFlight: a concurrency key's
// override of 2 in flight lapses while two of its requests run. The
// zone's own limit of 1 then applies, and the key's state is the requests
// in flight (docs/design.md "Runtime overrides: the adapter"), so a third
// request must be refused until they finish: the lapse changes the limit
// in force as a PUT does, and must not forget the slots taken under the
// override, in a memory zone or a redis zone.
func TestOverrideConcurrencyExpiryKeepsSlotsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		name := "ov_conc_expiry_" + store
		redisBlock := ""
		if store == storeRedis {
			if !redistest.Available() {
				t.Skip("no redis-server")
			}
			redisBlock = redisConfig(redistest.Start(t).Addr(), "timeout 5s")
		}
		clock := testutil.NewClock(time.Now().Add(time.Minute).Truncate(time.Millisecond))
		h := provisionHandlerAt(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm concurrency", "events 1", "store "+store), redisBlock), clock)
		const ip = "198.51.100.91"
		t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
		expires := clock.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
		if code, body := adminOverride(t, http.MethodPut, name, ip, `{"limit": 2, "expires": "`+expires+`"}`); code != 200 {
			t.Fatalf("PUT: %d %s", code, body)
		}

		a, b := holdKey(h, ip, nil), holdKey(h, ip, nil)
		if <-a.admitted != 200 || <-b.admitted != 200 {
			t.Fatal("two requests under an override of 2 in flight: one refused")
		}
		clock.Advance(2 * time.Second) // the override lapses
		c := holdKey(h, ip, nil)
		admitted := <-c.admitted == 200
		finish(a, b, c)
		if admitted {
			t.Fatal("a third request admitted while two run, under the zone's limit of 1 once the override lapsed: the slots taken under the override were forgotten")
		}
	})
}

// TestOverrideConcurrencyKeepsSlotsInFlight: a concurrency zone's key
// under override L1 (1 in flight) holds a slot while the operator changes
// the override to L2 and back to L1. A concurrency limit's state is the
// requests in flight, so L1 is not started afresh: a second request is
// refused while the first runs, and once it finishes exactly one more
// runs at a time. (Starting it afresh let the old slot be given back into
// the fresh state, and two requests ran under a limit of 1.)
func TestOverrideConcurrencyKeepsSlotsInFlight(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("ov_conc_slots", "key ip", "algorithm concurrency", "events 5")))
	const ip = "198.51.100.90"
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, "ov_conc_slots", ip, "") })
	if code, body := adminOverride(t, http.MethodPut, "ov_conc_slots", ip, `{"limit": 1}`); code != 200 {
		t.Fatalf("PUT L1: %d %s", code, body)
	}

	hold := func() heldRequest { return holdKey(h, ip, nil) }

	a := hold()
	if code := <-a.admitted; code != 200 {
		t.Fatalf("A under L1: %d", code)
	}
	if code, body := adminOverride(t, http.MethodPut, "ov_conc_slots", ip, `{"limit": 2}`); code != 200 {
		t.Fatalf("PUT L2: %d %s", code, body)
	}
	if code, body := adminOverride(t, http.MethodPut, "ov_conc_slots", ip, `{"limit": 1}`); code != 200 {
		t.Fatalf("PUT L1 again: %d %s", code, body)
	}
	// A concurrency limit's state is the requests in flight: setting L1
	// again keeps A's slot, so B is refused while A runs.
	refused := hold()
	if code := <-refused.admitted; code != 429 {
		t.Fatalf("B while A is in flight under L1 again: %d, want 429", code)
	}
	close(refused.release)
	<-refused.done
	close(a.release)
	<-a.done
	b := hold()
	if code := <-b.admitted; code != 200 {
		t.Fatalf("B once A finished: %d", code)
	}
	// B is in flight under L1 (1 in flight): C must be refused.
	c := hold()
	code := <-c.admitted
	close(b.release)
	close(c.release)
	<-b.done
	<-c.done
	if code == 200 {
		t.Fatal("C admitted while B is in flight under an override of 1 concurrent request: A's slot, taken before L1 started afresh, was given back into the fresh state")
	}
}

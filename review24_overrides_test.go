package ratelimit

import (
	"net/http"
	"testing"
	"time"
)

// Review findings (branch review-24): each test below reproduces one
// suspected bug of the override generations (12f7ffe) and fails on the
// build it was written against.

// rvServeKey sends one request of key ip through h and returns its status.
func rvServeKey(h *Handler, ip string) int {
	r, _ := newKeyRequest(ip, nil)
	_, code := serve(h, r, okHandler)
	return code
}

// TestReviewOverrideSamePolicyKeepsState: in a zone of 10/1h, the
// override {"limit": 2} and the override {"limit": 2, "window": "1h"} are
// one limit, 2 an hour: they make the same policy, so the same memory
// store (pooled by policy) and the same Redis key names. The build before
// 12f7ffe compared overrides by that policy (freshen: "Compared as the
// memory pool and the Redis key names tell limits apart") and kept the
// key's state when the operator only spelt the window out; overrideGen
// compares quotaOfOverride, whose window 0 differs from 1h, draws a new
// Gen, and the key, having spent its 2, is admitted 2 more within the
// hour under a limit of 2 an hour. The same holds for a burst given as
// the zone's own.
func TestReviewOverrideSamePolicyKeepsState(t *testing.T) {
	const name = "rv24_samepolicy"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 10/1h
		}
	}`)
	const ip = "198.51.100.124"
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
	put := func(body string) {
		t.Helper()
		if code, msg := adminOverride(t, http.MethodPut, name, ip, body); code != 200 {
			t.Fatalf("PUT %s: %d %s", body, code, msg)
		}
	}
	put(`{"limit": 2}`)
	for i := 0; i < 2; i++ {
		if code := rvServeKey(h, ip); code != 200 {
			t.Fatalf("request %d under 2/1h: %d", i+1, code)
		}
	}
	if code := rvServeKey(h, ip); code != 429 {
		t.Fatalf("third request under 2/1h: %d, want 429", code)
	}
	// The same limit, its window written out.
	put(`{"limit": 2, "window": "1h"}`)
	if code := rvServeKey(h, ip); code != 429 {
		t.Fatalf("after re-setting the same 2/1h with its window spelt out: %d, want 429 (the key's state started afresh: 2 more admitted within the hour under 2 an hour)", code)
	}
}

// TestReviewOverrideGenRace: putOverride reads the key's override in
// force (overrideGen) and writes the new one (set.put) without anything
// holding the two together, so two PUTs of the same new limit that
// interleave (an operator's retry, two automation jobs, or two instances
// of a redis zone whose tables have not yet seen each other's write)
// both see the old limit and both draw a new Gen. The first write starts
// the key afresh, requests spend it, and the second, which changes
// nothing the operator can see (same limit, same expiry: per the README
// it "keeps the state"), starts it afresh again. The test runs the two
// PUTs' steps in that interleaving, as the code allows: 4 admitted under
// a limit of 2.
func TestReviewOverrideGenRace(t *testing.T) {
	const name = "rv24_genrace"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 10/1h
		}
	}`)
	const ip = "198.51.100.125"
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, ip, "") })
	var z *zone
	for _, zz := range h.zones {
		if zz.name == name {
			z = zz
		}
	}
	if z == nil {
		t.Fatal("zone not found")
	}
	if code, msg := adminOverride(t, http.MethodPut, name, ip, `{"limit": 1}`); code != 200 {
		t.Fatalf("PUT L1: %d %s", code, msg)
	}
	// Two PUTs of {"limit": 2}, as putOverride runs them.
	two := int64(2)
	body := overrideBody{Limit: &two}
	o, err := body.override(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k := z.key.typed(ip)
	now := time.Now()
	o1, o2 := o, o
	o1.Gen = overrideGen(z.ov.set.table(), k, o1, now)       // PUT 1 reads L1
	o2.Gen = overrideGen(z.ov.set.table(), k, o2, now)       // PUT 2 reads L1 too
	if err := z.ov.set.put(t.Context(), k, o1); err != nil { // PUT 1 writes
		t.Fatal(err)
	}
	admitted := 0
	for i := 0; i < 3; i++ {
		if rvServeKey(h, ip) == 200 {
			admitted++
		}
	}
	if err := z.ov.set.put(t.Context(), k, o2); err != nil { // PUT 2 writes the same limit
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if rvServeKey(h, ip) == 200 {
			admitted++
		}
	}
	if admitted > 2 {
		t.Fatalf("two PUTs of limit 2 at once: %d admitted, want at most 2 (each PUT drew its own Gen: %d and %d)", admitted, o1.Gen, o2.Gen)
	}
}

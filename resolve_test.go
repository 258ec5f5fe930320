package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Zones of these tests have names of their own (rs_*): memory stores and
// memory zones' overrides are kept by zone name.

// rsPut sets key's override in h's zone name, as the admin API does
// (its set, keeping Gen as the API would, then the give-back of leases),
// and removes it when the test ends.
func rsPut(t *testing.T, h *Handler, name, key string, o limiter.Override) {
	t.Helper()
	var z *zone
	for _, hz := range h.zones {
		if hz.name == name {
			z = hz
		}
	}
	if z == nil {
		t.Fatalf("no zone %q", name)
	}
	if err := z.checkOverride(o); err != nil {
		t.Fatal(err)
	}
	if _, err := z.ov.set.put(context.Background(), key, o, keepGen([]*zone{z}, o, h.now())); err != nil {
		t.Fatal(err)
	}
	z.overrideChanged(key, nil)
	t.Cleanup(func() { z.ov.set.table().Remove(key) })
}

// rsInspect is the admin API's answer about key in zone name (one handler
// declares it).
func rsInspect(t *testing.T, name, key, tier string) keyState {
	t.Helper()
	target := adminPrefix + "zones/" + url.PathEscape(name) + "?key=" + url.QueryEscape(key)
	if tier != "" {
		target += "&tier=" + url.QueryEscape(tier)
	}
	w := httptest.NewRecorder()
	if err := serveAdmin(w, httptest.NewRequest(http.MethodGet, target, nil)); err != nil {
		t.Fatalf("inspect %s: %v", target, err)
	}
	var st keyState
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("inspect %s: %v in %s", target, err, w.Body)
	}
	return st
}

// TestResolveOverridesOnHandlersClock: whether an override is in force is
// judged on the handler's clock everywhere. On a clock two hours behind
// real time, an override that lapsed an hour ago in real time is still in
// force: the request path applies it, admin inspect and the overrides
// listing show it, rate_limit_status reports it, and the sweeper keeps
// it; once the handler's clock reaches its expiry, all of them see it
// lapsed and the sweeper removes it. On a clock two hours ahead, an
// override that real time holds in force has lapsed for all of them.
func TestResolveOverridesOnHandlersClock(t *testing.T) {
	real := time.Now().Truncate(time.Millisecond)
	start := real.Add(-2 * time.Hour)
	clock := testutil.NewClock(start)
	ctx := newConfig(t)
	h := provisionIn(t, ctx, clock, `rate_limit {
		zone rs_clock {
			key ip
			rate 5/1m
		}
	}`)
	s := provisionStatus(t, ctx, "rate_limit_status rs_clock")
	const blocked, limited = "198.51.100.201", "198.51.100.202"
	// Half an hour before real time, and more than blockRetry after
	// start: the blocked key is told to wait blockRetry.
	expires := start.Add(90 * time.Minute)
	rsPut(t, h, "rs_clock", blocked, limiter.Override{Action: limiter.OverrideBlock, Expires: expires})
	rsPut(t, h, "rs_clock", limited, limiter.Override{Action: limiter.OverrideLimit, Events: 2, Expires: expires})
	z := h.zones[0]

	inForce := func(when string) {
		t.Helper()
		if code, hdr := serveKey(h, blocked, ""); code != 429 || hdr.Get("Retry-After") != "3600" {
			t.Errorf("%s: blocked key's request: %d, Retry-After %q; want 429 after 3600", when, code, hdr.Get("Retry-After"))
		}
		if code, hdr := serveKey(h, limited, ""); code != 200 || hdr.Get("X-RateLimit-Limit") != "2" {
			t.Errorf("%s: limited key's request: %d, limit %q; want the override's 2", when, code, hdr.Get("X-RateLimit-Limit"))
		}
		if st := rsInspect(t, "rs_clock", blocked, ""); st.Override == nil || st.Override.Action != "block" || st.ResetAfter != 3600 {
			t.Errorf("%s: inspect of the blocked key %+v: want its block, 3600 s to wait", when, st)
		}
		if st := rsInspect(t, "rs_clock", limited, ""); st.Override == nil || st.Limit != 2 {
			t.Errorf("%s: inspect of the limited key %+v: want its limit 2", when, st)
		}
		if code, body := adminOverride(t, http.MethodGet, "rs_clock", blocked, ""); code != 200 {
			t.Errorf("%s: GET of the blocked key's override: %d %s", when, code, body)
		}
		if st := rsStatus(t, s, blocked); st != (zoneState{Zone: "rs_clock", Reset: 3600, Window: 3600}) {
			t.Errorf("%s: status of the blocked key %+v: want its block", when, st)
		}
		if st := rsStatus(t, s, limited); st.Limit != 2 {
			t.Errorf("%s: status of the limited key %+v: want its limit 2", when, st)
		}
	}
	inForce("before the expiry")
	// The sweeper runs every rotateEvery: it keeps what the handler's
	// clock holds in force.
	time.Sleep(rotateEvery + rotateEvery/2)
	if _, ok := z.ov.lookup(blocked); !ok {
		t.Fatal("the sweeper removed an override in force on the handler's clock")
	}
	clock.Advance(time.Second)
	inForce("a second later")

	clock.Set(expires)
	if code, hdr := serveKey(h, blocked, ""); code != 200 || hdr.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("at the expiry: blocked key's request: %d, limit %q; want the zone's 5", code, hdr.Get("X-RateLimit-Limit"))
	}
	if st := rsInspect(t, "rs_clock", limited, ""); st.Override != nil || st.Limit != 5 {
		t.Errorf("at the expiry: inspect of the limited key %+v: want the zone's limit, no override", st)
	}
	if code, _ := adminOverride(t, http.MethodGet, "rs_clock", limited, ""); code != 404 {
		t.Errorf("at the expiry: GET of the limited key's override: %d, want 404", code)
	}
	if st := rsStatus(t, s, limited); st.Limit != 5 || st.Remaining != 5 {
		t.Errorf("at the expiry: status of the limited key %+v: want the zone's 5, all left", st)
	}
	testutil.Eventually(t, "the sweeper removes the lapsed overrides", func() error {
		if _, ok := z.ov.lookup(limited); ok {
			return errors.New("still there")
		}
		return nil
	})

	// Ahead of real time: lapsed for the handler, though not in real time.
	clock.Set(real.Add(2 * time.Hour))
	const ahead = "198.51.100.203"
	if _, err := z.ov.set.put(context.Background(), ahead, limiter.Override{Action: limiter.OverrideBlock, Expires: real.Add(time.Hour)}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.ov.set.table().Remove(ahead) })
	if code, _ := serveKey(h, ahead, ""); code != 200 {
		t.Errorf("ahead: a block lapsed on the handler's clock refused the request: %d", code)
	}
	if st := rsInspect(t, "rs_clock", ahead, ""); st.Override != nil || st.Limit != 5 {
		t.Errorf("ahead: inspect %+v: want the zone's limit, no override", st)
	}
	if st := rsStatus(t, s, ahead); st.Limit != 5 || st.Remaining != 4 {
		t.Errorf("ahead: status %+v: want the zone's 5, 4 left", st)
	}
}

// rsStatus is rate_limit_status's answer for the client at ip in the one
// zone s answers for.
func rsStatus(t *testing.T, s *StatusHandler, ip string) zoneState {
	t.Helper()
	got, body := ask(t, s, ip, nil)
	if len(got) != 1 {
		t.Fatalf("status of %s: %s, want one zone", ip, body)
	}
	return got[0]
}

package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

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
	setOverrideAt(t, h, name, key, o, h.now())
}

// rsInspect is the admin API's answer about key in zone name (one handler
// declares it).
func rsInspect(t *testing.T, name, key, tier string) keyReport {
	t.Helper()
	target := adminPrefix + "zones/" + url.PathEscape(name) + "?key=" + url.QueryEscape(key)
	if tier != "" {
		target += "&tier=" + url.QueryEscape(tier)
	}
	w := httptest.NewRecorder()
	if err := serveAdmin(w, httptest.NewRequest(http.MethodGet, target, nil)); err != nil {
		t.Fatalf("inspect %s: %v", target, err)
	}
	var st keyReport
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
		if st := rsStatus(t, s, blocked); st != (zoneStatus{Zone: "rs_clock", Reset: 3600, Window: 3600}) {
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
func rsStatus(t *testing.T, s *StatusHandler, ip string) zoneStatus {
	t.Helper()
	got, body := ask(t, s, ip, nil)
	if len(got) != 1 {
		t.Fatalf("status of %s: %s, want one zone", ip, body)
	}
	return got[0]
}

// TestResolveSameEverywhere: for one key, the request path, admin
// inspect and rate_limit_status find the same limit and state: an
// exempt key (no fields, no status), a blocked one (its wait), one under
// an override limit, one of a tier, one of the zone's own limit, and a
// request without a key, decided (missing_key ip) by its client IP in the
// missing-key namespace, a state of its own that an override can name.
// (The admin API cannot name that namespace: inspect is left out there.)
func TestResolveSameEverywhere(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clock := testutil.NewClock(start)
	ctx := newConfig(t)
	h := provisionIn(t, ctx, clock, `rate_limit {
		zone rs_same {
			key header X-Key
			rate 5/1m
			tier {http.request.header.X-Plan} {
				pro 8/1m
			}
		}
	}`)
	s := provisionStatus(t, ctx, "rate_limit_status rs_same")
	const ip = "198.51.100.210"
	rsPut(t, h, "rs_same", "k-exempt", limiter.Override{Action: limiter.OverrideExempt})
	rsPut(t, h, "rs_same", "k-block", limiter.Override{Action: limiter.OverrideBlock, Expires: start.Add(10 * time.Minute)})
	rsPut(t, h, "rs_same", "k-limit", limiter.Override{Action: limiter.OverrideLimit, Events: 3})

	headers := func(key, plan string) map[string]string {
		hdr := map[string]string{}
		if key != "" {
			hdr["X-Key"] = key
		}
		if plan != "" {
			hdr["X-Plan"] = plan
		}
		return hdr
	}
	request := func(key, plan string) (int, http.Header) {
		r, _ := newKeyRequest(ip, headers(key, plan))
		w, code := serve(h, r, okHandler)
		return code, w.Header()
	}
	status := func(key, plan string) []zoneStatus {
		got, _ := ask(t, s, ip, headers(key, plan))
		return got
	}

	for _, c := range []struct {
		key, plan string
		// code, limit and remaining are the request's; wait is a
		// block's Retry-After (and inspect's and status's wait).
		code             int
		limit, remaining int64
		wait             int64
		override         string
		// none: the zone reports nothing (an exempt key).
		none bool
	}{
		{key: "k-exempt", code: 200, override: "exempt", none: true},
		{key: "k-block", code: 429, wait: 600, override: "block"},
		{key: "k-limit", plan: "pro", code: 200, limit: 3, remaining: 2, override: "limit"},
		{key: "k-tier", plan: "pro", code: 200, limit: 8, remaining: 7},
		{key: "k-zone", code: 200, limit: 5, remaining: 4},
	} {
		code, hdr := request(c.key, c.plan)
		wantLimit, wantRemaining := "", ""
		if c.limit > 0 {
			wantLimit, wantRemaining = strconv.FormatInt(c.limit, 10), strconv.FormatInt(c.remaining, 10)
		}
		if c.wait > 0 {
			wantLimit, wantRemaining = "0", "0"
			if got := hdr.Get("Retry-After"); got != strconv.FormatInt(c.wait, 10) {
				t.Errorf("%s: Retry-After %q, want %d", c.key, got, c.wait)
			}
		}
		if code != c.code || hdr.Get("X-RateLimit-Limit") != wantLimit || hdr.Get("X-RateLimit-Remaining") != wantRemaining {
			t.Errorf("%s: request %d, limit %q, remaining %q; want %d, %q, %q", c.key, code, hdr.Get("X-RateLimit-Limit"), hdr.Get("X-RateLimit-Remaining"), c.code, wantLimit, wantRemaining)
		}

		st := rsInspect(t, "rs_same", c.key, c.plan)
		gotOverride := ""
		if st.Override != nil {
			gotOverride = st.Override.Action
		}
		if gotOverride != c.override || st.Limit != c.limit || st.Remaining != c.remaining || int64(st.ResetAfter) != c.wait && c.wait > 0 {
			t.Errorf("%s: inspect %+v (override %q); want limit %d, remaining %d, wait %d, override %q", c.key, st, gotOverride, c.limit, c.remaining, c.wait, c.override)
		}

		got := status(c.key, c.plan)
		switch {
		case c.none:
			if len(got) != 0 {
				t.Errorf("%s: status %+v, want the zone left out", c.key, got)
			}
		case len(got) != 1 || got[0].Limit != c.limit || got[0].Remaining != c.remaining || c.wait > 0 && got[0].Reset != c.wait:
			t.Errorf("%s: status %+v; want limit %d, remaining %d, wait %d", c.key, got, c.limit, c.remaining, c.wait)
		}
	}

	// A request without a key: its client IP in the missing-key
	// namespace, apart from the key that is the same IP.
	z := h.zones[0]
	missing := missingKeyNamespace + ip
	if res := z.resolve("", false, "", func() *http.Request { r, _ := newKeyRequest(ip, nil); return r }(), time.Time{}); res.verdict != verdictDecide || res.key != missing || res.state != missing || res.limit != &z.limit {
		t.Fatalf("missing key: resolved %+v, want the zone's limit on %q", res, missing)
	}
	if code, hdr := request("", ""); code != 200 || hdr.Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("missing key: request %d, remaining %q; want 4", code, hdr.Get("X-RateLimit-Remaining"))
	}
	if got := status("", ""); len(got) != 1 || got[0].Limit != 5 || got[0].Remaining != 4 {
		t.Errorf("missing key: status %+v, want 5, 4 left", got)
	}
	if got := status(ip, ""); len(got) != 1 || got[0].Remaining != 5 {
		t.Errorf("the key that is the client's IP: status %+v, want its own state, 5 left", got)
	}
	if st := rsInspect(t, "rs_same", ip, ""); st.Remaining != 5 {
		t.Errorf("the key that is the client's IP: inspect %+v, want its own state, 5 left", st)
	}
	rsPut(t, h, "rs_same", missing, limiter.Override{Action: limiter.OverrideLimit, Events: 2})
	if code, hdr := request("", ""); code != 200 || hdr.Get("X-RateLimit-Limit") != "2" || hdr.Get("X-RateLimit-Remaining") != "1" {
		t.Errorf("missing key under an override: request %d, limit %q, remaining %q; want 2, 1", code, hdr.Get("X-RateLimit-Limit"), hdr.Get("X-RateLimit-Remaining"))
	}
	if got := status("", ""); len(got) != 1 || got[0].Limit != 2 || got[0].Remaining != 1 {
		t.Errorf("missing key under an override: status %+v, want 2, 1 left", got)
	}
}

// TestVariantPolicy: a tier's and an override's policies follow their
// documented rules (docs/reference.md, docs/admin-api.md: a tier's bucket burst is its events; an
// override's window, period or burst left out is the zone's), and an
// override's is the one limiter.Override.Policy describes.
func TestVariantPolicy(t *testing.T) {
	md := 5 * time.Second
	bucket := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Minute, Burst: 20, MaxDelay: &md}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	cal := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Calendar: &limiter.Calendar{Period: limiter.Month, Location: berlin}}

	tp := tierPolicy(bucket, TierLimit{MaxEvents: 100, Window: caddy.Duration(time.Hour)})
	if tp.Events != 100 || tp.Window != time.Hour || tp.Burst != 0 || tp.MaxDelay != &md || tp.Algorithm != limiter.TokenBucket {
		t.Errorf("tier of a bucket zone: %s, want 100/1h, burst its events, the zone's max_delay", tp)
	}
	if tp := tierPolicy(cal, TierLimit{MaxEvents: 7, Period: "day"}); tp.Calendar.Period != limiter.Day || tp.Calendar.Location != berlin || tp.Events != 7 || tp.Window != 0 {
		t.Errorf("tier of a calendar zone: %s, want 7 per Berlin day", tp)
	}
	for _, c := range []struct {
		p    limiter.Policy
		o    limiter.Override
		want string
	}{
		{bucket, limiter.Override{Action: limiter.OverrideLimit, Events: 100}, "token_bucket:100/60000000us:burst=20:max_delay=5000000us"},
		{bucket, limiter.Override{Action: limiter.OverrideLimit, Events: 100, Window: time.Hour, Burst: 150}, "token_bucket:100/3600000000us:burst=150:max_delay=5000000us"},
		{cal, limiter.Override{Action: limiter.OverrideLimit, Events: 3}, "fixed_window:3/calendar=month@Europe/Berlin"},
		{cal, limiter.Override{Action: limiter.OverrideLimit, Events: 3, Period: limiter.Week}, "fixed_window:3/calendar=week@Europe/Berlin"},
	} {
		got := overrideVariant(&c.o).policy(c.p)
		if got.String() != c.want || got.String() != c.o.Policy(c.p).String() {
			t.Errorf("override %+v of %s: %s, want %s (limiter: %s)", c.o, c.p, got, c.want, c.o.Policy(c.p))
		}
	}
}

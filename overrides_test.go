package ratelimit

// Tests of how an override decides its key: precedence over tiers and the
// zone, block, exempt and limit actions, their expiry, and what a zone's
// algorithm refuses.

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestOverridePrecedence: a key's override decides it before its tier,
// and its tier before the zone; each limit's state is its own, so a key
// that spent its tier's limit gets the override's whole limit, and a
// changed override limit starts afresh.
func TestOverridePrecedence(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("ov_precedence", "key ip", "rate 2/1m", "tier {http.request.header.X-Plan} {", "pro 4/1m", "}")))
	const ip = "198.51.100.70"
	for i := range 4 {
		if code, hdr := serveKey(h, ip, "pro"); code != 200 || hdr.Get("X-RateLimit-Limit") != "4" {
			t.Fatalf("tier request %d: %d, limit %q", i, code, hdr.Get("X-RateLimit-Limit"))
		}
	}
	if code, _ := serveKey(h, ip, "pro"); code != 429 {
		t.Fatalf("tier spent: %d, want 429", code)
	}
	setOverride(t, h, "ov_precedence", ip, limiter.Override{Action: limiter.OverrideLimit, Events: 3})
	for i := range 3 {
		code, hdr := serveKey(h, ip, "pro")
		if code != 200 || hdr.Get("X-RateLimit-Limit") != "3" || hdr.Get("RateLimit-Policy") != `"ov_precedence";q=3;w=60` {
			t.Fatalf("override request %d: %d, limit %q, policy %q", i, code, hdr.Get("X-RateLimit-Limit"), hdr.Get("RateLimit-Policy"))
		}
	}
	if code, _ := serveKey(h, ip, "pro"); code != 429 {
		t.Fatalf("override spent: %d, want 429", code)
	}
	setOverride(t, h, "ov_precedence", ip, limiter.Override{Action: limiter.OverrideLimit, Events: 5, Window: time.Hour})
	if code, hdr := serveKey(h, ip, ""); code != 200 || hdr.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("changed override: %d, remaining %q, want a fresh 5/1h", code, hdr.Get("X-RateLimit-Remaining"))
	}
	if err := handlerZone(t, h, "ov_precedence").ov.set.table().Remove(ip); !err {
		t.Fatal("no override to remove")
	}
	if code, _ := serveKey(h, ip, "pro"); code != 429 {
		t.Fatalf("override removed: %d, want the tier's spent state again", code)
	}
}

// TestOverrideBlockAndExpiry: a block refuses with Retry-After to its
// expiry (an hour without one), exact to the second on the handler's
// clock, and the zone decides again from the expiry on.
func TestOverrideBlockAndExpiry(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clock := testutil.NewClock(start)
	h := provisionHandlerAt(t, rateLimitConfig(zoneConfig("ov_block", "key ip", "rate 5/1m")), clock)
	const ip, other = "198.51.100.71", "198.51.100.72"
	setOverride(t, h, "ov_block", ip, limiter.Override{Action: limiter.OverrideBlock, Expires: start.Add(90 * time.Second)})
	setOverride(t, h, "ov_block", other, limiter.Override{Action: limiter.OverrideBlock})
	clock.Set(start.Add(30*time.Second + 500*time.Millisecond))
	code, hdr := serveKey(h, ip, "")
	if code != 429 || hdr.Get("Retry-After") != "60" || hdr.Get("RateLimit-Policy") != `"ov_block";q=0;w=3600` || hdr.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("blocked: %d, Retry-After %q, policy %q, remaining %q", code, hdr.Get("Retry-After"), hdr.Get("RateLimit-Policy"), hdr.Get("X-RateLimit-Remaining"))
	}
	if code, hdr := serveKey(h, other, ""); code != 429 || hdr.Get("Retry-After") != "3600" {
		t.Fatalf("blocked without expiry: %d, Retry-After %q, want 3600", code, hdr.Get("Retry-After"))
	}
	clock.Set(start.Add(90*time.Second - time.Millisecond))
	if code, hdr := serveKey(h, ip, ""); code != 429 || hdr.Get("Retry-After") != "1" {
		t.Fatalf("a millisecond before the expiry: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	clock.Set(start.Add(90 * time.Second))
	if code, hdr := serveKey(h, ip, ""); code != 200 || hdr.Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("at the expiry: %d, limit %q, want the zone's", code, hdr.Get("X-RateLimit-Limit"))
	}
}

// TestOverrideExempt: an exempt key is never limited and gets no field
// from that zone; another zone still writes its own, and the decision
// counts in the metrics.
func TestOverrideExempt(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("ov_exempt", "key ip", "rate 1/1m"), zoneConfig("ov_exempt_other", "key ip", "rate 100/1m")))
	const ip = "198.51.100.73"
	setOverride(t, h, "ov_exempt", ip, limiter.Override{Action: limiter.OverrideExempt})
	for i := range 5 {
		code, hdr := serveKey(h, ip, "")
		if code != 200 || hdr.Get("RateLimit-Policy") != `"ov_exempt_other";q=100;w=60` || hdr.Get("X-RateLimit-Limit") != "100" {
			t.Fatalf("exempt request %d: %d, policy %q, limit %q", i, code, hdr.Get("RateLimit-Policy"), hdr.Get("X-RateLimit-Limit"))
		}
	}
}

// TestOverrideRefusals: what a zone's algorithm cannot take is refused
// when the override is set, not when a request needs it.
func TestOverrideRefusals(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("ov_refuse_log", "key ip", "rate 10/1m"), zoneConfig("ov_refuse_cal", "key ip", "events 10", "calendar day"), zoneConfig("ov_refuse_cost", "key ip", "algorithm token_bucket", "rate 10/1m", "cost 5")))
	for _, c := range []struct {
		zone string
		o    limiter.Override
	}{
		{"ov_refuse_log", limiter.Override{Action: limiter.OverrideLimit, Events: 10, Burst: 5}},
		{"ov_refuse_log", limiter.Override{Action: limiter.OverrideLimit, Events: 0}},
		{"ov_refuse_log", limiter.Override{Action: limiter.OverrideLimit, Events: 10, Period: limiter.Day}},
		{"ov_refuse_cal", limiter.Override{Action: limiter.OverrideLimit, Events: 10, Window: time.Hour}},
		{"ov_refuse_cost", limiter.Override{Action: limiter.OverrideLimit, Events: 4}},
		{"ov_refuse_log", limiter.Override{Action: limiter.OverrideBlock, Events: 4}},
	} {
		if err := handlerZone(t, h, c.zone).checkOverride(c.o); err == nil {
			t.Errorf("zone %s took %+v", c.zone, c.o)
		}
	}
	if err := handlerZone(t, h, "ov_refuse_cal").checkOverride(limiter.Override{Action: limiter.OverrideLimit, Events: 100, Period: limiter.Month}); err != nil {
		t.Errorf("a calendar zone refused a monthly override: %v", err)
	}
}

// BenchmarkHandlerOverrides is BenchmarkHandlerIPKey on a zone with no
// overrides and with 100,000, for a key without one and a key with one
// (a limit as high as the zone's): a key without an override must cost
// what it costs on a zone without any. The 100k case also reports the
// memory the overrides hold, per override.
func BenchmarkHandlerOverrides(b *testing.B) {
	for _, n := range []int{0, 100_000} {
		for _, keyed := range []bool{false, true} {
			if n == 0 && keyed {
				continue
			}
			name := fmt.Sprintf("overrides=%d/key_with_override=%v", n, keyed)
			b.Run(name, func(b *testing.B) {
				zone := fmt.Sprintf("bench_ov_%d_%v", n, keyed)
				h := provisionHandler(b, "rate_limit {\n zone "+zone+" {\n  key ip\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n}")
				z := handlerZone(b, h, zone)
				// The set outlives the handler: start it empty.
				z.ov.set.table().Replace(map[string]limiter.Override{})
				b.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
				before := int64(heapInUse())
				for i := range n {
					// With a generation, as every PUT now writes one: the
					// key's state is then named key + NUL + gen.
					z.ov.set.table().Put(fmt.Sprintf("203.0.%d.%d", i/250, i%250), limiter.Override{Action: limiter.OverrideLimit, Events: 2_000_000_000, Window: time.Second, Gen: limiter.NewOverrideGen()})
				}
				held := float64(int64(heapInUse())-before) / float64(max(n, 1))
				ip := "198.51.100.9"
				if keyed {
					ip = "203.0.7.7"
				}
				r, _ := newKeyRequest(ip, nil)
				benchServeFresh(b, h, []*http.Request{r})
				if n > 0 {
					b.ReportMetric(held, "B/override")
				}
			})
		}
	}
}

// TestOverrideRetryAfterCappedAtExpiry: a key under an override limit of
// 1/1h (the zone's is 100/1h) that expires in 10 s is refused with a
// Retry-After of at most those 10 s, and admitted by the zone once the
// override has lapsed. (The bug it guards against: the refusal said Retry-After: 3600;
// only a block's wait was capped at its expiry.)
func TestOverrideRetryAfterCappedAtExpiry(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clock := testutil.NewClock(start)
	h := provisionHandlerAt(t, rateLimitConfig(zoneConfig("ov_lim_exp", "key ip", "algorithm fixed_window", "rate 100/1h")), clock)
	const ip = "198.51.100.161"
	setOverride(t, h, "ov_lim_exp", ip, limiter.Override{Action: limiter.OverrideLimit, Events: 1, Expires: start.Add(10 * time.Second)})
	if code, _ := serveKey(h, ip, ""); code != 200 {
		t.Fatalf("first request under 1/1h: %d", code)
	}
	code, hdr := serveKey(h, ip, "")
	if code != 429 {
		t.Fatalf("second request under 1/1h: %d, want 429", code)
	}
	retry := hdr.Get("Retry-After")
	clock.Set(start.Add(10 * time.Second))
	after, _ := serveKey(h, ip, "")
	if n, _ := strconv.Atoi(retry); n > 10 {
		t.Fatalf("refused 10s before its override lapses with Retry-After %s (X-RateLimit-Reset %s, start %d); at the expiry the key is answered %d: Retry-After is not capped at the override's expiry",
			retry, hdr.Get("X-RateLimit-Reset"), start.Unix(), after)
	}
	if after != 200 {
		t.Fatalf("at the override's expiry: %d, want 200 from the zone's own limit", after)
	}
}

// TestOverrideExemptStripsResponseCost: a response_cost zone without
// `keep` removes the upstream's cost field from the client's response for
// an exempt key too: the exemption changes what the zone limits, not what
// it strips. (The bug it guards against: the exempt key's response kept X-Tokens.)
func TestOverrideExemptStripsResponseCost(t *testing.T) {
	const name = "ov_exempt_cost"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm fixed_window", "rate 100/1h", "response_cost X-Tokens")))
	const plain, exempt = "198.51.100.171", "198.51.100.172"
	r, _ := newKeyRequest(plain, nil)
	if w, _ := serve(h, r, answer(200, "X-Tokens", "42")); w.Header().Get("X-Tokens") != "" {
		t.Fatalf("control: X-Tokens reached a key without override")
	}
	setOverride(t, h, name, exempt, limiter.Override{Action: limiter.OverrideExempt})
	r, _ = newKeyRequest(exempt, nil)
	w, code := serve(h, r, answer(200, "X-Tokens", "42"))
	if got := w.Header().Get("X-Tokens"); got != "" {
		t.Fatalf("exempt key: status %d, X-Tokens %q reached the client of a response_cost zone without keep", code, got)
	}
}

// TestOverrideBlockWithRequestCost: in a zone whose cost is a placeholder
// (`cost {http.request.header.X-Cost}`), a blocked key's request is
// refused with 429 and an honest Retry-After whatever its cost. (Before
// its fix it got 400: the block's limit has no maxCost, and the cost was
// refused as one the limit could never admit.)
func TestOverrideBlockWithRequestCost(t *testing.T) {
	const name, ip = "ov_block_cost", "198.51.100.191"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm fixed_window", "rate 100/1h", "cost {http.request.header.X-Cost}")))
	setOverride(t, h, name, ip, limiter.Override{Action: limiter.OverrideBlock})
	r, _ := newKeyRequest(ip, map[string]string{"X-Cost": "3"})
	w, code := serve(h, r, okHandler)
	if code != 429 || w.Header().Get("Retry-After") != "3600" {
		t.Fatalf("blocked key with X-Cost: 3: status %d, Retry-After %q, want 429 and 3600", code, w.Header().Get("Retry-After"))
	}
}

package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Zones of these tests have names of their own (xp_*): memory stores are
// pooled by zone name and limit.

// exceededName is the placeholder a zone with `exceeded pass` sets.
const exceededName = "http.rate_limit.exceeded.name"

// passing is what one request through a handler with `exceeded pass`
// zones came to.
type passing struct {
	code   int
	header http.Header
	// called is set when the next handler ran; exceeded is what
	// {http.rate_limit.exceeded.name} said then, or, for a request that
	// did not pass, once the handler returned ("" while unset).
	called   bool
	exceeded string
}

// servePassing sends one request of ip with headers through h to next
// (okHandler if nil), noting what the placeholder said.
func servePassing(h *Handler, ip string, headers map[string]string, next caddyhttp.Handler) passing {
	if next == nil {
		next = okHandler
	}
	var p passing
	r, repl := newKeyRequest(ip, headers)
	read := func() string {
		if v, ok := repl.Get(exceededName); ok {
			return fmt.Sprint(v)
		}
		return ""
	}
	w, code := serve(h, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		p.called, p.exceeded = true, read()
		return next.ServeHTTP(w, r)
	}))
	if !p.called {
		p.exceeded = read()
	}
	p.code, p.header = code, w.Header()
	return p
}

// wantServed fails unless p was served, answered status by the next
// handler, with the placeholder naming zone ("": unset, no zone over its
// limit), and without Retry-After.
func wantServed(t *testing.T, what string, p passing, status int, zone string) {
	t.Helper()
	if p.code != status || !p.called || p.exceeded != zone {
		t.Fatalf("%s: status %d, next ran %v, exceeded.name %q; want %d from next, exceeded.name %q", what, p.code, p.called, p.exceeded, status, zone)
	}
	if v := p.header.Get("Retry-After"); v != "" {
		t.Errorf("%s: Retry-After %q on a request served", what, v)
	}
}

// wantPassed fails unless p was passed on by zone and answered 200.
func wantPassed(t *testing.T, what string, p passing, zone string) {
	t.Helper()
	wantServed(t, what, p, 200, zone)
}

// wantAdmitted fails unless p was answered 200 with no zone over its
// limit.
func wantAdmitted(t *testing.T, what string, p passing) {
	t.Helper()
	wantServed(t, what, p, 200, "")
}

// storeRemaining is what zone name's store has left for key.
func storeRemaining(t *testing.T, h *Handler, name, key string) int64 {
	t.Helper()
	d, err := handlerZone(t, h, name).limit.store.Peek(context.Background(), key)
	if err != nil {
		t.Fatalf("peek %s: %v", name, err)
	}
	return d.Remaining
}

// redisBlockFor is a redis block on a fresh redis-server for a redis
// store, or nothing for memory. (A redis zone whose requests vary in
// cost turns its denial cache off when a test needs a cheaper request
// after a dearer one was passed on to be decided by Redis: a cached
// refusal is repeated whatever the next request costs.)
func redisBlockFor(t *testing.T, store string) string {
	t.Helper()
	if store != storeRedis {
		return ""
	}
	// timeout 1s: under a loaded CI machine the 5 ms default can fail a
	// decision open, which is not what these tests ask about.
	return redisConfig(redistest.Start(t).Addr(), "timeout 1s")
}

// passingPair provisions, for store, two fixed_window zones keyed by the
// client's IP and named for the test (prefix_a_<store>, prefix_b_<store>):
// a, with `exceeded pass` and aOpts, and b, decided after it, with bOpts.
// redis is the redis block a redis store needs (redisBlockFor), which a
// test may give another handler too.
func passingPair(t *testing.T, store, redis, prefix string, aOpts, bOpts []string) (h *Handler, a, b string) {
	t.Helper()
	a, b = prefix+"_a_"+store, prefix+"_b_"+store
	zone := []string{"key ip", "algorithm fixed_window", "store " + store}
	h = provisionHandler(t, rateLimitConfig(
		zoneConfig(a, slices.Concat(zone, []string{"exceeded pass"}, aOpts)...),
		zoneConfig(b, slices.Concat(zone, bOpts)...),
		redis,
	))
	return h, a, b
}

// denyCacheOff is the option that turns a redis zone's denial cache off,
// or nothing for memory.
func denyCacheOff(store string) string {
	if store != storeRedis {
		return ""
	}
	return "deny_cache off"
}

func TestExceededCaddyfile(t *testing.T) {
	h, err := parseDirective(t, rateLimitConfig(
		zoneConfig("a", "rate 1/1s", "exceeded pass"),
		zoneConfig("b", "rate 1/1s", "exceeded refuse"),
		zoneConfig("c", "rate 1/1s"),
	))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": "pass", "b": "refuse", "c": ""} {
		if got := h.RateLimits[name].Exceeded; got != want {
			t.Errorf("zone %s: exceeded %q, want %q", name, got, want)
		}
	}
	raw, err := json.Marshal(h.RateLimits["a"])
	if err != nil || !strings.Contains(string(raw), `"exceeded":"pass"`) {
		t.Errorf("zone a as JSON: %s (%v), want \"exceeded\":\"pass\"", raw, err)
	}
	runParseErrorCases(t, []parseErrorCase{
		{"unknown value", rateLimitConfig(zoneConfig("a", "rate 1/1s", "exceeded maybe")),
			[]string{`zone a: unknown exceeded "maybe" (want refuse or pass)`, ":2"}},
		{"no value", rateLimitConfig(zoneConfig("a", "rate 1/1s", "exceeded")),
			[]string{"zone a: option 'exceeded' takes refuse | pass", ":4"}},
		{"two values", rateLimitConfig(zoneConfig("a", "rate 1/1s", "exceeded pass refuse")),
			[]string{"zone a: option 'exceeded' takes refuse | pass", ":4"}},
	})
	var j Handler
	if err := json.Unmarshal([]byte(`{"rate_limits":{"z":{"max_events":5,"window":"1m","exceeded":"sometimes"}}}`), &j); err != nil {
		t.Fatal(err)
	}
	if err := j.validate(); err == nil || !strings.Contains(err.Error(), `unknown exceeded "sometimes"`) {
		t.Errorf("JSON exceeded \"sometimes\": %v, want it refused", err)
	}
}

// TestExceededPassPassesOn: a request over the limit of an `exceeded
// pass` zone is served with the placeholder naming the zone, takes
// nothing there (a later request that fits is admitted), and is counted
// by the zone after it as any request it admits; the headers report the
// zone's state with no Retry-After, and decisions_total counts it
// `passed`. When the zone after it refuses, the request is refused, as
// without the option.
func TestExceededPassPassesOn(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		ip := map[string]string{storeMemory: "198.51.100.201", storeRedis: "198.51.100.202"}[store]
		h, a, b := passingPair(t, store, redisBlockFor(t, store), "xp_on",
			[]string{"rate 5/1h", "cost {http.request.header.X-Cost}", denyCacheOff(store)}, []string{"rate 3/1h"})
		za, zb := handlerZone(t, h, a), handlerZone(t, h, b)
		cost := func(n int) map[string]string { return map[string]string{"X-Cost": strconv.Itoa(n)} }

		wantAdmitted(t, "first (cost 3)", servePassing(h, ip, cost(3), nil))

		passedBefore, allowedBefore := counterValue(t, za.metrics.passed), counterValue(t, zb.metrics.allowed)
		p := servePassing(h, ip, cost(3), nil)
		wantPassed(t, "second (cost 3, 2 left)", p, a)
		if got := p.header.Get("X-RateLimit-Remaining"); got != "2" {
			t.Errorf("X-RateLimit-Remaining %q, want 2: the passing zone's state", got)
		}
		if got := p.header.Get("X-RateLimit-Limit"); got != "5" {
			t.Errorf("X-RateLimit-Limit %q, want 5: the passing zone's", got)
		}
		reset, err := strconv.ParseInt(p.header.Get("X-RateLimit-Reset"), 10, 64)
		if now := time.Now().Unix(); err != nil || reset <= now || reset > now+3601 {
			t.Errorf("X-RateLimit-Reset %q, want the end of the zone's hour", p.header.Get("X-RateLimit-Reset"))
		}
		if got := remainingIn(t, p.header, a); got != "2" {
			t.Errorf("RateLimit's %s r=%s, want 2", a, got)
		}
		if got := remainingIn(t, p.header, b); got != "1" {
			t.Errorf("RateLimit's %s r=%s, want 1: the zone after the passing one counts the request", b, got)
		}
		if got := counterValue(t, za.metrics.passed) - passedBefore; got != 1 {
			t.Errorf("decisions_total{result=passed} of %s rose by %v, want 1", a, got)
		}
		if got := counterValue(t, zb.metrics.allowed) - allowedBefore; got != 1 {
			t.Errorf("decisions_total{result=allowed} of %s rose by %v, want 1", b, got)
		}

		// The passed request took nothing: 2 units fit.
		p = servePassing(h, ip, cost(2), nil)
		wantAdmitted(t, "third (cost 2)", p)
		if got := remainingIn(t, p.header, a); got != "0" {
			t.Errorf("RateLimit's %s r=%s after 3 + 2 units, want 0", a, got)
		}

		// Over both: b refuses, as without the option.
		deniedBefore := counterValue(t, zb.metrics.denied)
		passedBefore = counterValue(t, za.metrics.passed)
		p = servePassing(h, ip, cost(1), nil)
		if p.code != http.StatusTooManyRequests || p.called || p.exceeded != b {
			t.Fatalf("fourth, over both: status %d, next ran %v, exceeded.name %q; want 429 by %s", p.code, p.called, p.exceeded, b)
		}
		if p.header.Get("Retry-After") == "" {
			t.Error("the refusal has no Retry-After")
		}
		if got := counterValue(t, zb.metrics.denied) - deniedBefore; got != 1 {
			t.Errorf("%s counted %v refusals, want 1", b, got)
		}
		if got := counterValue(t, za.metrics.passed) - passedBefore; got != 1 {
			t.Errorf("%s counted %v passed, want 1 (it was decided before the refusal)", a, got)
		}
		if got := storeRemaining(t, h, a, ip); got != 0 {
			t.Errorf("%s has %d left, want 0", a, got)
		}
	})
}

// TestExceededPassZoneBeforeIt: a zone before the passing one in name
// order counts the request too, and the placeholders other than
// exceeded.name describe the passing zone.
func TestExceededPassZoneBeforeIt(t *testing.T) {
	const ip = "198.51.100.203"
	h := provisionHandler(t, rateLimitConfig(
		zoneConfig("xp_before_a", "key ip", "rate 10/1h"),
		zoneConfig("xp_before_b", "key ip", "rate 1/1h", "exceeded pass"),
	))
	wantAdmitted(t, "first", servePassing(h, ip, nil, nil))
	var zoneName, remaining string
	p := servePassing(h, ip, nil, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		zoneName = repl.ReplaceAll("{http.rate_limit.zone}", "")
		remaining = repl.ReplaceAll("{http.rate_limit.remaining}", "")
		return nil
	}))
	wantPassed(t, "second", p, "xp_before_b")
	if got := remainingIn(t, p.header, "xp_before_a"); got != "8" {
		t.Errorf("RateLimit's xp_before_a r=%s, want 8: the zone before the passing one counts it", got)
	}
	if zoneName != "xp_before_b" || remaining != "0" {
		t.Errorf("{http.rate_limit.zone} %q, .remaining %q; want the passing zone's, xp_before_b and 0", zoneName, remaining)
	}
}

// TestExceededPassTwoZones: when two passing zones are over their limits,
// the placeholder and the single-valued headers name the first in name
// order; each counts the request passed.
func TestExceededPassTwoZones(t *testing.T) {
	const ip = "198.51.100.204"
	h := provisionHandler(t, rateLimitConfig(
		zoneConfig("xp_two_a", "key ip", "rate 1/1h", "exceeded pass"),
		zoneConfig("xp_two_b", "key ip", "rate 2/1h", "exceeded pass"),
	))
	za, zb := handlerZone(t, h, "xp_two_a"), handlerZone(t, h, "xp_two_b")
	wantAdmitted(t, "first", servePassing(h, ip, nil, nil))
	// Only a over its limit; b admits.
	wantPassed(t, "second", servePassing(h, ip, nil, nil), "xp_two_a")
	pa, pb := counterValue(t, za.metrics.passed), counterValue(t, zb.metrics.passed)
	p := servePassing(h, ip, nil, nil)
	wantPassed(t, "third, over both", p, "xp_two_a")
	if got := p.header.Get("X-RateLimit-Limit"); got != "1" {
		t.Errorf("X-RateLimit-Limit %q, want 1: the first passing zone's", got)
	}
	if counterValue(t, za.metrics.passed)-pa != 1 || counterValue(t, zb.metrics.passed)-pb != 1 {
		t.Error("both zones must count the third request passed")
	}
}

// TestExceededPassDryRun: a dry_run zone passes nothing on: over its
// limit it counts dry_run_denied, sets no placeholder, and lets the
// request through as any dry run does.
func TestExceededPassDryRun(t *testing.T) {
	const ip = "198.51.100.205"
	h := provisionHandler(t, rateLimitConfig(zoneConfig("xp_dry", "key ip", "rate 1/1h", "exceeded pass", "dry_run")))
	z := handlerZone(t, h, "xp_dry")
	wantAdmitted(t, "first", servePassing(h, ip, nil, nil))
	dry, passed := counterValue(t, z.metrics.dryRunDenied), counterValue(t, z.metrics.passed)
	p := servePassing(h, ip, nil, nil)
	wantAdmitted(t, "second, over the dry run's limit", p)
	if got := remainingIn(t, p.header, "xp_dry"); got != "0" {
		t.Errorf("RateLimit r=%s, want 0", got)
	}
	if counterValue(t, z.metrics.dryRunDenied)-dry != 1 || counterValue(t, z.metrics.passed)-passed != 0 {
		t.Error("a dry run over its limit counts dry_run_denied, not passed")
	}
}

// TestExceededPassConcurrency: a request passed on by a concurrency zone
// holds no slot: with it in flight, the slot the first request frees is
// taken by the next.
func TestExceededPassConcurrency(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		ip := map[string]string{storeMemory: "198.51.100.206", storeRedis: "198.51.100.207"}[store]
		h := provisionHandler(t, rateLimitConfig(
			zoneConfig("xp_conc_"+store, "key ip", "algorithm concurrency", "events 1", "exceeded pass", "store "+store),
			redisBlockFor(t, store),
		))
		a := holdPassing(h, ip)
		if got := <-a.exceeded; got != "" {
			t.Fatalf("A: exceeded.name %q, want it admitted", got)
		}
		b := holdPassing(h, ip)
		if got := <-b.exceeded; got != "xp_conc_"+store {
			t.Fatalf("B with A in flight: exceeded.name %q, want passed on", got)
		}
		close(a.release)
		if code := <-a.done; code != 200 {
			t.Fatalf("A: %d", code)
		}
		c := holdPassing(h, ip)
		got := <-c.exceeded
		close(b.release)
		close(c.release)
		if code := <-b.done; code != 200 {
			t.Errorf("B: %d", code)
		}
		<-c.done
		if got != "" {
			t.Fatalf("C with only B (passed on) in flight: exceeded.name %q, want it admitted: B holds no slot", got)
		}
		// Every slot is free again.
		wantAdmitted(t, "after all finished", servePassing(h, ip, nil, nil))
	})
}

// heldPassing is a request held in its next handler: exceeded gets what
// {http.rate_limit.exceeded.name} said there, release lets it answer
// 200, done gets its status.
type heldPassing struct {
	exceeded chan string
	release  chan struct{}
	done     chan int
}

// holdPassing sends a request of ip through h on a goroutine, held in
// next until released. A refused request never reaches next: its
// exceeded gets "refused".
func holdPassing(h *Handler, ip string) heldPassing {
	hp := heldPassing{exceeded: make(chan string, 1), release: make(chan struct{}), done: make(chan int, 1)}
	go func() {
		p := servePassing(h, ip, nil, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			v, _ := repl.GetString(exceededName)
			hp.exceeded <- v
			<-hp.release
			w.WriteHeader(200)
			return nil
		}))
		if !p.called {
			hp.exceeded <- "refused"
		}
		hp.done <- p.code
	}()
	return hp
}

// TestExceededPassNotHeld: a leaky bucket that would hold a request
// longer than max_delay passes it on at once instead of refusing it; the
// request is not held.
func TestExceededPassNotHeld(t *testing.T) {
	const ip = "198.51.100.208"
	h := provisionHandler(t, rateLimitConfig(
		zoneConfig("xp_leaky", "key ip", "algorithm leaky_bucket", "rate 1/10s", "burst 1", "max_delay 1s", "exceeded pass"),
	))
	wantAdmitted(t, "first", servePassing(h, ip, nil, nil))
	start := time.Now()
	wantPassed(t, "second, 10s early", servePassing(h, ip, nil, nil), "xp_leaky")
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("the request passed on took %v: it was held", took)
	}
}

// TestExceededPassCountResponse: a passed request settles nothing in the
// passing zone, and the zones that admitted it settle by its response as
// usual: count_response counts a matching response and gives back for
// another.
func TestExceededPassCountResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		ip := map[string]string{storeMemory: "198.51.100.209", storeRedis: "198.51.100.210"}[store]
		count401 := []string{"count_response {", "status 401", "}"}
		h, a, b := passingPair(t, store, redisBlockFor(t, store), "xp_count",
			append([]string{"rate 1/1h"}, count401...), append([]string{"rate 5/1h"}, count401...))
		failures := func(z string) int64 { return storeRemaining(t, h, z, ip) }
		wantServed(t, "first (401)", servePassing(h, ip, nil, answer(401)), 401, "")
		if failures(a) != 0 || failures(b) != 4 {
			t.Fatalf("after one 401: %d and %d left, want 0 and 4", failures(a), failures(b))
		}
		fails := counterValue(t, handlerZone(t, h, a).metrics.storeFailures)
		wantServed(t, "second (401)", servePassing(h, ip, nil, answer(401)), 401, a)
		if failures(b) != 3 {
			t.Errorf("%s: %d left after a passed request answered 401, want 3: it counts as usual", b, failures(b))
		}
		wantPassed(t, "third (200)", servePassing(h, ip, nil, answer(200)), a)
		if failures(b) != 3 {
			t.Errorf("%s: %d left after a passed request answered 200, want 3: it gives back as usual", b, failures(b))
		}
		if failures(a) != 0 {
			t.Errorf("%s: %d left, want 0", a, failures(a))
		}
		if got := counterValue(t, handlerZone(t, h, a).metrics.storeFailures) - fails; got != 0 {
			t.Errorf("%s counted %v store failures settling what it never took", a, got)
		}
	})
}

// TestExceededPassResponseCost: a passed request's reported cost is not
// charged to the passing zone, which took nothing, while a zone that
// admitted it is charged; the field is still removed from the response,
// in a header or a trailer, even when the passing zone is the only one.
func TestExceededPassResponseCost(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		ip := map[string]string{storeMemory: "198.51.100.211", storeRedis: "198.51.100.212"}[store]
		redis := redisBlockFor(t, store)
		tokens := []string{"cost 10", "response_cost X-Tokens"}
		h, a, b := passingPair(t, store, redis, "xp_cost",
			append([]string{"rate 100/1h"}, tokens...), append([]string{"rate 1000/1h"}, tokens...))
		left := func(z string) int64 { return storeRemaining(t, h, z, ip) }
		p := servePassing(h, ip, nil, answer(200, "X-Tokens", "95"))
		wantAdmitted(t, "first (95 tokens)", p)
		if left(a) != 5 || left(b) != 905 {
			t.Fatalf("after 95 tokens: %d and %d left, want 5 and 905", left(a), left(b))
		}
		reads := counterValue(t, handlerZone(t, h, a).metrics.responseCosts[responseCostRead])
		p = servePassing(h, ip, nil, answer(200, "X-Tokens", "50"))
		wantPassed(t, "second (10 up front, 5 left)", p, a)
		if v := p.header.Get("X-Tokens"); v != "" {
			t.Errorf("X-Tokens %q reached the client", v)
		}
		if left(a) != 5 {
			t.Errorf("%s: %d left after a passed request reported 50, want 5: nothing charged", a, left(a))
		}
		if left(b) != 855 {
			t.Errorf("%s: %d left after a passed request reported 50, want 855: charged as usual", b, left(b))
		}
		if got := counterValue(t, handlerZone(t, h, a).metrics.responseCosts[responseCostRead]) - reads; got != 0 {
			t.Errorf("%s read %v response costs of a request it passed on, want 0", a, got)
		}

		// The passing zone alone: its field is removed all the same.
		c := "xp_cost_c_" + store
		hc := provisionHandler(t, rateLimitConfig(
			zoneConfig(c, "key ip", "algorithm fixed_window", "rate 10/1h", "cost 10", "response_cost X-Tokens", "exceeded pass", "store "+store),
			redis,
		))
		wantAdmitted(t, "c first", servePassing(hc, ip, nil, answer(200, "X-Tokens", "10")))
		p = servePassing(hc, ip, nil, answer(200, "X-Tokens", "7"))
		wantPassed(t, "c second", p, c)
		if v := p.header.Get("X-Tokens"); v != "" {
			t.Errorf("c alone: X-Tokens %q reached the client", v)
		}
		trailer := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Trailer", "X-Tokens")
			w.WriteHeader(200)
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set(http.TrailerPrefix+"X-Tokens", "7")
			return nil
		})
		p = servePassing(hc, ip, nil, trailer)
		wantPassed(t, "c third, cost in a trailer", p, c)
		if v, ok := p.header[http.TrailerPrefix+"X-Tokens"]; ok {
			t.Errorf("c alone: the X-Tokens trailer %q reached the client", v)
		}
		if v := p.header.Get("Trailer"); v != "" {
			t.Errorf("c alone: Trailer %q still announces the removed trailer", v)
		}
		if left(a) != 5 {
			t.Errorf("%s: %d left, want 5", a, left(a))
		}
	})
}

// TestExceededPassNearCache: a redis zone with leases and the denial
// cache passes requests on as it refuses them today: from the denial
// cache, without asking Redis again, and counted `passed`.
func TestExceededPassNearCache(t *testing.T) {
	const ip = "198.51.100.213"
	h := provisionHandler(t, rateLimitConfig(
		zoneConfig("xp_near", "key ip", "algorithm fixed_window", "rate 4/1h", "store redis", "local_quota 0.5", "exceeded pass"),
		redisConfig(redistest.Start(t).Addr(), "timeout 1s"),
	))
	z := handlerZone(t, h, "xp_near")
	for i := range 4 {
		wantAdmitted(t, fmt.Sprintf("request %d", i+1), servePassing(h, ip, nil, nil))
	}
	fromCache, passed := counterValue(t, z.metrics.fromDenyCache), counterValue(t, z.metrics.passed)
	for i := range 3 {
		p := servePassing(h, ip, nil, nil)
		wantPassed(t, fmt.Sprintf("request %d", i+5), p, "xp_near")
		if got := p.header.Get("X-RateLimit-Remaining"); got != "0" {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want 0", i+5, got)
		}
	}
	if got := counterValue(t, z.metrics.passed) - passed; got != 3 {
		t.Errorf("decisions_total{result=passed} rose by %v, want 3", got)
	}
	if got := counterValue(t, z.metrics.fromDenyCache) - fromCache; got < 2 {
		t.Errorf("%v of the 3 passed requests were decided by the denial cache, want at least the last 2", got)
	}
}

// TestExceededPassStillRefuses: an override's block and missing_key deny
// refuse in a passing zone: neither is a request over the limit.
func TestExceededPassStillRefuses(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(
		zoneConfig("xp_block", "key header X-Key", "rate 5/1h", "missing_key deny", "exceeded pass"),
	))
	setOverride(t, h, "xp_block", "blocked", limiter.Override{Action: limiter.OverrideBlock})
	z := handlerZone(t, h, "xp_block")
	denied := counterValue(t, z.metrics.denied)
	for what, hdr := range map[string]map[string]string{
		"a blocked key":  {"X-Key": "blocked"},
		"a missing key":  nil,
		"an unknown key": {"X-Key": "free"},
	} {
		p := servePassing(h, "198.51.100.214", hdr, nil)
		if what == "an unknown key" {
			wantAdmitted(t, what, p)
			continue
		}
		if p.code != http.StatusTooManyRequests || p.called || p.exceeded != "xp_block" {
			t.Errorf("%s: status %d, next ran %v, exceeded.name %q; want 429", what, p.code, p.called, p.exceeded)
		}
	}
	if got := counterValue(t, z.metrics.denied) - denied; got != 2 {
		t.Errorf("decisions_total{result=denied} rose by %v, want 2", got)
	}
}

// TestExceededPassStatus: rate_limit_status reports a passing zone's
// state as its headers do, and a passed request changes nothing there.
func TestExceededPassStatus(t *testing.T) {
	ctx := newConfig(t)
	clock := testutil.NewClock(time.Unix(1_699_999_200, 0).Add(15 * time.Minute))
	h := provisionIn(t, ctx, clock, rateLimitConfig(
		zoneConfig("xp_status", "key ip", "algorithm fixed_window", "rate 5/1h", "cost {http.request.header.X-Cost}", "exceeded pass"),
	))
	s := provisionStatus(t, ctx, "rate_limit_status xp_status")
	const ip = "198.51.100.215"
	wantAdmitted(t, "cost 3", servePassing(h, ip, map[string]string{"X-Cost": "3"}, nil))
	want := zoneStatus{Zone: "xp_status", Limit: 5, Remaining: 2, Reset: 2700, Window: 3600}
	got, _ := ask(t, s, ip, nil)
	wantStates(t, "after 3 units", got, want)
	p := servePassing(h, ip, map[string]string{"X-Cost": "3"}, nil)
	wantPassed(t, "cost 3 with 2 left", p, "xp_status")
	got, _ = ask(t, s, ip, nil)
	wantStates(t, "after a request passed on", got, want)
	if r := remainingIn(t, p.header, "xp_status"); r != "2" {
		t.Errorf("the passed request's RateLimit r=%s, the status 2", r)
	}
}

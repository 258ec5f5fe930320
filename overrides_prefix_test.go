package ratelimit

// Tests of prefix overrides (?prefix=<p>): which override decides a key
// (its own, then the longest prefix, then its tier, then the zone), each
// key's count of its own under a prefix's limit, the admin routes on
// memory and redis zones, Pub/Sub between instances, expiry, reloads and
// the bound.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// pxConfig is a zone name keyed by X-Key, 2 an hour by fixed window, with
// a tier pro of 4 an hour picked by X-Plan, in store (a redis zone on the
// server at redisAddr).
func pxConfig(name, store, redisAddr string) string {
	zone := zoneConfig(name, "key {http.request.header.X-Key}", "algorithm fixed_window", "rate 2/1h", "store "+store,
		"tier {http.request.header.X-Plan} {", "pro 4/1h", "}")
	if store == storeRedis {
		// timeout 1s: a zone that failed open under a loaded CI machine
		// would answer 200 without fields, not what the test asks.
		return rateLimitConfig(zone, redisConfig(redisAddr, "timeout 1s"))
	}
	return rateLimitConfig(zone)
}

// pxHandler provisions pxConfig's zone (a redis zone on a server of its
// own) and empties its overrides when the test ends: a memory zone's
// outlive the handler.
func pxHandler(t *testing.T, name, store string, clock limiter.Clock) *Handler {
	t.Helper()
	addr := ""
	if store == storeRedis {
		addr = redistest.Start(t).Addr()
	}
	h := provisionHandlerAt(t, pxConfig(name, store, addr), clock)
	z := handlerZone(t, h, name)
	t.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
	return h
}

// pxServe sends one request of key (with X-Plan: plan when not "") and
// returns its status and X-RateLimit-Limit.
func pxServe(h *Handler, key, plan string) (int, string) {
	code, hdr := servePlan(h, "203.0.113.1", plan, map[string]string{"X-Key": key})
	return code, hdr.Get("X-RateLimit-Limit")
}

// pxAdmin sends one request to the overrides route of zone name with the
// query as given ("prefix=acme%3A") and returns its status and body (an
// adminError's status and message when the route refused it).
func pxAdmin(t *testing.T, method, name, query, body string) (int, string) {
	t.Helper()
	target := adminPrefix + "zones/" + url.PathEscape(name) + "/overrides"
	if query != "" {
		target += "?" + query
	}
	w := httptest.NewRecorder()
	if err := serveAdmin(w, httptest.NewRequest(method, target, strings.NewReader(body))); err != nil {
		var ae caddy.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		return ae.HTTPStatus, ae.Message
	}
	return w.Code, w.Body.String()
}

// prefixQuery is the query naming prefix p.
func prefixQuery(p string) string { return url.Values{"prefix": {p}}.Encode() }

// TestPrefixOverridePrecedence: which override zone.resolve applies, at
// a time: a key's own beats the longest prefix of the key that has one,
// which beats the key's tier, which beats the zone; an override that has
// lapsed but is not yet swept is passed over for the next one down (a
// key's own for its longest prefix's, a prefix's for a shorter one's);
// a block or an exemption by prefix decides as a key's would; and each
// key under a prefix's limit has a state of its own, named by the key
// and the prefix's Gen.
func TestPrefixOverridePrecedence(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	const name = "px_precedence"
	h := pxHandler(t, name, storeMemory, testutil.NewClock(start))
	z := handlerZone(t, h, name)
	limit := func(n int64, expires time.Duration) limiter.Override {
		o := limiter.Override{Action: limiter.OverrideLimit, Events: n}
		if expires != 0 {
			o.Expires = start.Add(expires)
		}
		return o
	}
	pre := limiter.PrefixOverrideName
	for k, o := range map[string]limiter.Override{
		pre("acme:"):       limit(10, 0),
		pre("acme:vip"):    limit(20, 0),
		"acme:vip1":        limit(30, 0),
		"acme:vip2":        limit(60, time.Minute),
		pre("acme:vipold"): limit(70, time.Minute),
		pre("blocked:"):    {Action: limiter.OverrideBlock},
		pre("ops:"):        {Action: limiter.OverrideExempt},
		"ops:evil":         {Action: limiter.OverrideBlock},
	} {
		setOverrideAt(t, h, name, k, o, start)
	}
	later := start.Add(2 * time.Minute)
	for _, c := range []struct {
		key, tier string
		at        time.Time
		verdict   verdict
		quota     int64
		prefix    string
	}{
		{"globex:1", "", start, verdictDecide, 2, ""},
		{"globex:1", "pro", start, verdictDecide, 4, ""},
		{"acme:1", "pro", start, verdictDecide, 10, "acme:"},
		{"acme:", "", start, verdictDecide, 10, "acme:"},
		{"acme", "", start, verdictDecide, 2, ""},
		{"acme:vip9", "", start, verdictDecide, 20, "acme:vip"},
		{"acme:vip1", "pro", start, verdictDecide, 30, ""},
		{"acme:vip2", "", start, verdictDecide, 60, ""},
		{"acme:vipold1", "", start, verdictDecide, 70, "acme:vipold"},
		{"acme:vip2", "", later, verdictDecide, 20, "acme:vip"},
		{"acme:vipold1", "", later, verdictDecide, 20, "acme:vip"},
		{"blocked:x", "pro", start, verdictBlock, 0, "blocked:"},
		{"ops:1", "", start, verdictExempt, 0, "ops:"},
		{"ops:evil", "", start, verdictBlock, 0, ""},
	} {
		res := z.resolve(c.key, true, c.tier, nil, c.at)
		quota, _ := res.limit.policy.Quota()
		if c.verdict != verdictDecide {
			quota = 0
		}
		override := res.inForce
		if res.verdict != c.verdict || quota != c.quota || res.prefix != c.prefix || override != (c.quota != 2 && c.quota != 4) {
			t.Errorf("%s (tier %q) at %v: verdict %d, quota %d, prefix %q, override %v; want %d, %d, %q",
				c.key, c.tier, c.at.Sub(start), res.verdict, quota, res.prefix, override, c.verdict, c.quota, c.prefix)
		}
	}
	a, b := z.resolve("acme:1", true, "", nil, start), z.resolve("acme:2", true, "", nil, start)
	if a.state == b.state || a.state != a.override.StateKey("acme:1") || !strings.HasPrefix(a.state, "acme:1\x00") {
		t.Errorf("states under the prefix acme: %q and %q: want each key's own, named by key and Gen", a.state, b.state)
	}
	// Through the request path, on the handler's clock.
	for _, c := range []struct{ key, plan, limit string }{
		{"acme:1", "pro", "10"}, {"acme:vip9", "", "20"}, {"acme:vip1", "", "30"}, {"globex:1", "pro", "4"},
	} {
		if code, l := pxServe(h, c.key, c.plan); code != 200 || l != c.limit {
			t.Errorf("request of %s (plan %q): %d, limit %q; want 200 under %s", c.key, c.plan, code, l, c.limit)
		}
	}
	if code, _ := pxServe(h, "blocked:x", ""); code != 429 {
		t.Errorf("request of a key under a blocked prefix: %d, want 429", code)
	}
}

// TestPrefixOverrideKeysCountApart: under a prefix's limit of 2 an hour
// each key counts its own 2; setting the same limit again (an expiry
// added) keeps every key's count, a new limit starts them afresh. Admin
// inspect, reset and rate_limit_status see a key under the prefix as its
// requests do.
func TestPrefixOverrideKeysCountApart(t *testing.T) {
	const name = "px_apart"
	ctx := newConfig(t)
	h := provisionIn(t, ctx, nil, pxConfig(name, storeMemory, ""))
	t.Cleanup(func() { handlerZone(t, h, name).ov.set.table().Replace(map[string]limiter.Override{}) })
	s := provisionStatus(t, ctx, "rate_limit_status "+name)
	put := func(body string) {
		t.Helper()
		if code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery("acme:"), body); code != 200 {
			t.Fatalf("PUT %s: %d %s", body, code, msg)
		}
	}
	codes := func(key string, n int) []int {
		var out []int
		for range n {
			code, _ := pxServe(h, key, "")
			out = append(out, code)
		}
		return out
	}
	put(`{"limit": 2}`)
	if got := codes("acme:1", 3); fmt.Sprint(got) != "[200 200 429]" {
		t.Fatalf("acme:1 under 2/1h: %v", got)
	}
	if got := codes("acme:2", 1); got[0] != 200 {
		t.Fatalf("acme:2 after acme:1 spent its 2: %d, want its own count", got[0])
	}
	st := rsInspect(t, name, "acme:1", "")
	if st.Override == nil || st.Override.Prefix != "acme:" || st.Override.Key != "" || st.Limit != 2 || st.Remaining != 0 {
		t.Errorf("inspect of acme:1: %+v (override %+v), want the prefix's limit, spent", st, st.Override)
	}
	statuses, body := ask(t, s, "203.0.113.1", map[string]string{"X-Key": "acme:2"})
	if len(statuses) != 1 || statuses[0].Limit != 2 || statuses[0].Remaining != 1 {
		t.Errorf("status of acme:2: %s, want 2 with 1 left", body)
	}
	put(`{"limit": 2, "expires": "1h"}`)
	if got := codes("acme:1", 1); got[0] != 429 {
		t.Errorf("acme:1 after the same limit was given an expiry: %d, want its spent state kept", got[0])
	}
	put(`{"limit": 3}`)
	if got := codes("acme:1", 1); got[0] != 200 {
		t.Errorf("acme:1 under a new limit of 3: %d, want a fresh count", got[0])
	}
	codes("acme:1", 2)
	w := httptest.NewRecorder()
	if err := serveAdmin(w, httptest.NewRequest(http.MethodDelete, adminPrefix+"zones/"+name+"?key=acme:1", nil)); err != nil || !strings.Contains(w.Body.String(), `"reset":true`) {
		t.Fatalf("reset of acme:1: %v %s", err, w.Body)
	}
	if got := codes("acme:1", 1); got[0] != 200 {
		t.Errorf("acme:1 after its reset: %d, want its count under the prefix's limit forgotten", got[0])
	}
}

// TestPrefixOverrideAdminRoutes: PUT, GET and DELETE take ?prefix= where
// they take ?key=, on a memory zone and a redis zone: the answers name a
// prefix's override by "prefix" and a key's by "key", the listing gives
// the keys' first, one key's and one prefix's are looked up apart, and
// requests follow each change; an empty prefix (the zone's own limit),
// one too long, and both parameters at once are refused with 400.
func TestPrefixOverrideAdminRoutes(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		name := "px_admin_" + store
		h := pxHandler(t, name, store, nil)
		acme := prefixQuery("acme:")
		if code, body := pxAdmin(t, http.MethodPut, name, acme, `{"limit": 10}`); code != 200 || !strings.Contains(body, `"override":{"prefix":"acme:","action":"limit","limit":10}`) {
			t.Fatalf("PUT ?prefix=acme:: %d %s", code, body)
		}
		if code, body := pxAdmin(t, http.MethodPut, name, "key=acme%3A1", `{"action": "block"}`); code != 200 {
			t.Fatalf("PUT ?key=acme:1: %d %s", code, body)
		}
		if _, l := pxServe(h, "acme:2", ""); l != "10" {
			t.Errorf("acme:2 under the prefix: limit %q, want 10", l)
		}
		if code, _ := pxServe(h, "acme:1", ""); code != 429 {
			t.Errorf("acme:1, blocked by its own override: %d, want 429", code)
		}
		code, body := pxAdmin(t, http.MethodGet, name, "", "")
		var list zoneOverrides
		if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list.Overrides) != 2 ||
			list.Overrides[0] != (overrideView{Key: "acme:1", Action: "block"}) || list.Overrides[1] != (overrideView{Prefix: "acme:", Action: "limit", Limit: 10}) {
			t.Errorf("GET: %d %s (%v), want the key's override, then the prefix's", code, body, err)
		}
		if code, body := pxAdmin(t, http.MethodGet, name, acme, ""); code != 200 || !strings.Contains(body, `"prefix":"acme:"`) {
			t.Errorf("GET ?prefix=acme:: %d %s", code, body)
		}
		if code, msg := pxAdmin(t, http.MethodGet, name, prefixQuery("acme:1"), ""); code != 404 || !strings.Contains(msg, `no override for prefix "acme:1"`) {
			t.Errorf("GET ?prefix=acme:1 (a key's override): %d %s, want 404", code, msg)
		}
		if code, _ := pxAdmin(t, http.MethodGet, name, "key=acme%3A", ""); code != 404 {
			t.Errorf("GET ?key=acme: (the prefix's override): %d, want 404", code)
		}
		for _, c := range []struct{ method, query, body, want string }{
			{http.MethodPut, "prefix=", `{"limit": 5}`, "an empty prefix would match every key, which is the zone's own limit"},
			{http.MethodDelete, "prefix=", "", "an empty prefix"},
			{http.MethodPut, prefixQuery(strings.Repeat("p", limiter.MaxOverrideKeyLen+1)), `{"limit": 5}`, "prefix of 1025 bytes is longer than the 1024"},
			{http.MethodPut, "key=a&prefix=b", `{"limit": 5}`, "not both"},
			{http.MethodPut, acme, `{"limit": 0}`, "limit must be positive"},
		} {
			if code, msg := pxAdmin(t, c.method, name, c.query, c.body); code != 400 || !strings.Contains(msg, c.want) {
				t.Errorf("%s ?%.40s: %d %s, want 400 saying %q", c.method, c.query, code, msg, c.want)
			}
		}
		if code, body := pxAdmin(t, http.MethodDelete, name, acme, ""); code != 200 || body != `{"zone":"`+name+`","prefix":"acme:","deleted":true}`+"\n" {
			t.Errorf("DELETE ?prefix=acme:: %d %s", code, body)
		}
		if _, l := pxServe(h, "acme:2", ""); l != "2" {
			t.Errorf("acme:2 after the prefix's delete: limit %q, want the zone's 2", l)
		}
		if code, body := pxAdmin(t, http.MethodDelete, name, acme, ""); code != 200 || !strings.Contains(body, `"deleted":false`) {
			t.Errorf("DELETE ?prefix=acme: again: %d %s", code, body)
		}
		if code, _ := pxServe(h, "acme:1", ""); code != 429 {
			t.Errorf("acme:1 after its prefix's delete: %d, want its own block still", code)
		}
	})
}

// TestPrefixOverridePropagatesOverRedis: two instances of a redis zone
// (handlers on clocks of their own, so each has its own subscription): a
// prefix override set on one reaches the other's requests, a key's own
// override set there beats it, and its delete reaches the other too.
func TestPrefixOverridePropagatesOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	const name = "px_pubsub"
	config := pxConfig(name, storeRedis, srv.Addr())
	one := provisionHandlerAt(t, config, testutil.NewClock(time.Now()))
	two := provisionHandlerAt(t, config, testutil.NewClock(time.Now()))
	if one.overrides == two.overrides {
		t.Fatal("the two handlers share their overrides: nothing would travel by Pub/Sub")
	}
	waitLimit := func(key, want string) {
		t.Helper()
		testutil.Within(t, key+"'s limit on the other instance", time.Second, func() error {
			if _, l := pxServe(two, key, ""); l != want {
				return fmt.Errorf("limit %q, want %q", l, want)
			}
			return nil
		})
	}
	acme := limiter.PrefixOverrideName("acme:")
	setOverride(t, one, name, acme, limiter.Override{Action: limiter.OverrideLimit, Events: 10})
	waitLimit("acme:2", "10")
	setOverride(t, one, name, "acme:1", limiter.Override{Action: limiter.OverrideLimit, Events: 5})
	waitLimit("acme:1", "5")
	if _, err := handlerZone(t, one, name).ov.set.remove(t.Context(), acme); err != nil {
		t.Fatal(err)
	}
	waitLimit("acme:2", "2")
	if _, l := pxServe(two, "acme:1", ""); l != "5" {
		t.Errorf("acme:1 after its prefix's delete: limit %q, want its own 5", l)
	}
}

// TestPrefixOverrideExpiry: a prefix override lapses at its expiry on
// the handler's clock: a blocked prefix's keys are told to wait no longer
// than it, a limited prefix's keys are decided by the zone from it on,
// and the sweeper then removes both, so the listing is empty.
func TestPrefixOverrideExpiry(t *testing.T) {
	start := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	clock := testutil.NewClock(start)
	const name = "px_expiry"
	h := pxHandler(t, name, storeMemory, clock)
	z := handlerZone(t, h, name)
	for p, body := range map[string]string{"acme:": `{"limit": 10, "expires": "90s"}`, "bad:": `{"action": "block", "expires": "90s"}`} {
		if code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery(p), body); code != 200 {
			t.Fatalf("PUT %s: %d %s", p, code, msg)
		}
	}
	clock.Set(start.Add(30 * time.Second))
	if _, l := pxServe(h, "acme:1", ""); l != "10" {
		t.Errorf("30s in: acme:1's limit %q, want the prefix's 10", l)
	}
	r, _ := newKeyRequest("203.0.113.1", map[string]string{"X-Key": "bad:1"})
	if w, code := serve(h, r, okHandler); code != 429 || w.Header().Get("Retry-After") != "60" {
		t.Errorf("30s in: bad:1 %d, Retry-After %q; want 429 and the 60s left of its prefix's block", code, w.Header().Get("Retry-After"))
	}
	clock.Set(start.Add(90 * time.Second))
	if code, l := pxServe(h, "acme:1", ""); code != 200 || l != "2" {
		t.Errorf("at the expiry: acme:1 %d, limit %q; want the zone's 2", code, l)
	}
	if code, _ := pxServe(h, "bad:1", ""); code != 200 {
		t.Errorf("at the expiry: bad:1 %d, want 200", code)
	}
	testutil.Eventually(t, "the sweeper to remove the lapsed prefixes", func() error {
		if n := z.ov.set.table().Prefixes(); n != 0 {
			return fmt.Errorf("%d prefixes left", n)
		}
		return nil
	})
	if code, body := pxAdmin(t, http.MethodGet, name, "", ""); code != 200 || !strings.Contains(body, `"overrides":[]`) {
		t.Errorf("GET after the sweep: %d %s", code, body)
	}
}

// TestPrefixOverrideKeptAcrossReload: a reload keeps a zone's prefix
// overrides and the counts of the keys under them, on a memory zone (its
// overrides are the process's, its override limits' stores taken over)
// and a redis zone.
func TestPrefixOverrideKeptAcrossReload(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		name := "px_reload_" + store
		addr := ""
		if store == storeRedis {
			addr = redistest.Start(t).Addr()
		}
		old := provisionHandler(t, pxConfig(name, store, addr))
		t.Cleanup(func() { handlerZone(t, old, name).ov.set.table().Replace(map[string]limiter.Override{}) })
		if code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery("acme:"), `{"limit": 3}`); code != 200 {
			t.Fatalf("PUT: %d %s", code, msg)
		}
		for range 3 {
			pxServe(old, "acme:1", "")
		}
		reloaded := provisionHandler(t, pxConfig(name, store, addr))
		_ = old.Cleanup()
		if code, l := pxServe(reloaded, "acme:1", ""); code != 429 || l != "3" {
			t.Errorf("acme:1 after the reload: %d, limit %q; want 429 under the prefix's 3, its count kept", code, l)
		}
		if code, l := pxServe(reloaded, "acme:2", ""); code != 200 || l != "3" {
			t.Errorf("acme:2 after the reload: %d, limit %q; want 200 under the prefix's 3", code, l)
		}
	})
}

// TestPrefixOverrideBound: a zone holds at most 10,000 prefix overrides:
// the PUT of one more is refused with 400 and says so, while a held
// prefix may change and a key's own override is still taken; requests of
// the keys under the last prefix taken are decided by it.
func TestPrefixOverrideBound(t *testing.T) {
	const name = "px_bound"
	h := pxHandler(t, name, storeMemory, nil)
	var wg sync.WaitGroup
	var failed sync.Map
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < limiter.MaxPrefixOverrides; i += 4 {
				if code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery(fmt.Sprintf("t%d:", i)), `{"limit": 7}`); code != 200 {
					failed.Store(i, msg)
				}
			}
		})
	}
	wg.Wait()
	failed.Range(func(i, msg any) bool {
		t.Fatalf("PUT of prefix %v: %v", i, msg)
		return false
	})
	code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery("one-more:"), `{"limit": 7}`)
	if code != 400 || !strings.Contains(msg, "10000 prefix overrides, the most one zone may") {
		t.Errorf("PUT of prefix 10,001: %d %s, want 400", code, msg)
	}
	if code, msg := pxAdmin(t, http.MethodPut, name, prefixQuery("t0:"), `{"limit": 8}`); code != 200 {
		t.Errorf("changing a held prefix: %d %s", code, msg)
	}
	if code, msg := pxAdmin(t, http.MethodPut, name, "key=k", `{"limit": 8}`); code != 200 {
		t.Errorf("a key's own override beside 10,000 prefixes: %d %s", code, msg)
	}
	if _, l := pxServe(h, fmt.Sprintf("t%d:u", limiter.MaxPrefixOverrides-1), ""); l != "7" {
		t.Errorf("a key under the last prefix taken: limit %q, want 7", l)
	}
	if _, l := pxServe(h, "one-more:u", ""); l != "2" {
		t.Errorf("a key under the refused prefix: limit %q, want the zone's 2", l)
	}
}

// BenchmarkHandlerPrefixOverrides is BenchmarkHandlerOverrides for
// prefixes: a request of a zone keyed like "{tenant}:{user}" with no
// prefix overrides and with 10,000 ("tenant-0:" on), for a key under none
// of them (a tenant past them, which walks "tenant-" and four digits) and
// a key under one (a limit as high as the zone's).
func BenchmarkHandlerPrefixOverrides(b *testing.B) {
	for _, c := range []struct {
		prefixes int
		key      string
	}{
		{0, "tenant-12345:user-42"},
		{10_000, "tenant-12345:user-42"},
		{10_000, "tenant-4242:user-42"},
	} {
		under := c.key == "tenant-4242:user-42"
		b.Run(fmt.Sprintf("prefixes=%d/key_under_prefix=%v", c.prefixes, under), func(b *testing.B) {
			// Zone names of one length, so no state name lands in another size class.
			zone := fmt.Sprintf("bench_px_%05d_%v", c.prefixes, under)
			h := provisionHandler(b, "rate_limit {\n zone "+zone+" {\n  key {http.request.header.X-Key}\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n}")
			z := handlerZone(b, h, zone)
			all := make(map[string]limiter.Override, c.prefixes)
			for i := range c.prefixes {
				all[limiter.PrefixOverrideName(fmt.Sprintf("tenant-%d:", i))] = limiter.Override{Action: limiter.OverrideLimit, Events: 2_000_000_000, Window: time.Second, Gen: limiter.NewOverrideGen()}
			}
			z.ov.set.table().Replace(all)
			b.Cleanup(func() { z.ov.set.table().Replace(map[string]limiter.Override{}) })
			r, _ := newKeyRequest("203.0.113.1", map[string]string{"X-Key": c.key})
			benchServeFresh(b, h, []*http.Request{r})
		})
	}
}

package ratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	// basic_auth, which TestStatusCaddyfile orders the directive after.
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Zones of these tests have names of their own (st_*): memory stores are
// pooled by zone name and limit, and a store keeps the clock of the first
// handler that made it.

// newConfig is the context of one config load, cancelled when the test
// ends, after the handlers provisioned in it are cleaned up.
func newConfig(t *testing.T) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

// provisionIn parses a rate_limit directive and provisions it in the
// config ctx on clock (nil: the system clock), cleaning it up when the
// test ends.
func provisionIn(t *testing.T, ctx caddy.Context, clock limiter.Clock, input string) *Handler {
	t.Helper()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
		t.Fatal(err)
	}
	h.clock = clock
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// provisionStatus parses a rate_limit_status directive and provisions it
// in the config ctx.
func provisionStatus(t *testing.T, ctx caddy.Context, input string) *StatusHandler {
	t.Helper()
	s := new(StatusHandler)
	if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// statusRequest builds a request for /rate_limit as Caddy's server would
// hand it to a handler, as newKeyRequest does for /api/items.
func statusRequest(method, clientIP string, headers map[string]string) *http.Request {
	r := httptest.NewRequest(method, "http://example.com/rate_limit", nil)
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	repl := caddyhttp.NewTestReplacer(r)
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: clientIP})
	return r.WithContext(ctx)
}

// ask sends a GET for the status of the client at ip with headers and
// returns the decoded answer and the raw body.
func ask(t *testing.T, s *StatusHandler, ip string, headers map[string]string) ([]zoneStatus, string) {
	t.Helper()
	w := httptest.NewRecorder()
	if err := s.ServeHTTP(w, statusRequest(http.MethodGet, ip, headers), nil); err != nil {
		t.Fatalf("status: %v", err)
	}
	if w.Code != http.StatusOK {
		t.Fatalf("status: %d", w.Code)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var a statusAnswer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("answer %q: %v", w.Body, err)
	}
	if a.Zones == nil {
		t.Fatalf("answer %q: zones is not an array", w.Body)
	}
	return a.Zones, w.Body.String()
}

// spend sends n requests of the client at ip with headers through h,
// each of which must pass.
func spend(t *testing.T, h *Handler, n int, ip string, headers map[string]string) {
	t.Helper()
	for i := range n {
		r, _ := newKeyRequest(ip, headers)
		if _, code := serve(h, r, okHandler); code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, code)
		}
	}
}

func wantStates(t *testing.T, what string, got []zoneStatus, want ...zoneStatus) {
	t.Helper()
	if want == nil {
		want = []zoneStatus{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: answered %+v, want %+v", what, got, want)
	}
}

// TestStatusConsumesNothing: after three requests the answer shows three
// fewer in every zone, asking again changes nothing (nor does it change
// what the next request is left), and the key is never in the body.
func TestStatusConsumesNothing(t *testing.T) {
	ctx := newConfig(t)
	// A quarter past an hour (fixed windows are aligned to the epoch).
	clock := testutil.NewClock(time.Unix(1_699_999_200, 0).Add(15 * time.Minute))
	h := provisionIn(t, ctx, clock, `rate_limit {
		zone st_fixed {
			key header X-API-Key
			algorithm fixed_window
			rate 10/1h
		}
		zone st_bucket {
			key ip
			algorithm token_bucket
			rate 5/1m
		}
	}`)
	s := provisionStatus(t, ctx, "rate_limit_status")
	const ip, apiKey = "198.51.100.61", "k-3f9a-secret"
	hdr := map[string]string{"X-API-Key": apiKey}
	spend(t, h, 3, ip, hdr)

	first, body := ask(t, s, ip, hdr)
	// 45 minutes remain of the fixed window; the bucket refills three
	// tokens in 3 × 12 s.
	wantStates(t, "after three requests", first,
		zoneStatus{Zone: "st_bucket", Limit: 5, Remaining: 2, Reset: 36, Window: 60},
		zoneStatus{Zone: "st_fixed", Limit: 10, Remaining: 7, Reset: 2700, Window: 3600},
	)
	for _, secret := range []string{apiKey, ip} {
		if strings.Contains(body, secret) {
			t.Errorf("the answer %q shows the key %q", body, secret)
		}
	}
	again, body2 := ask(t, s, ip, hdr)
	if body2 != body {
		t.Errorf("asking again changed the answer: %q, then %q", body, body2)
	}
	wantStates(t, "asked twice", again, first...)

	// The next request is the fourth, not the sixth.
	r, _ := newKeyRequest(ip, hdr)
	w, _ := serve(h, r, okHandler)
	if got := w.Header().Get("RateLimit"); !strings.Contains(got, `"st_fixed";r=6;`) {
		t.Errorf("RateLimit %q after two status requests: want st_fixed r=6", got)
	}
	// Another client is untouched.
	other, _ := ask(t, s, "198.51.100.62", map[string]string{"X-API-Key": "k-other"})
	wantStates(t, "another client", other,
		zoneStatus{Zone: "st_bucket", Limit: 5, Remaining: 5, Reset: 0, Window: 60},
		zoneStatus{Zone: "st_fixed", Limit: 10, Remaining: 10, Reset: 0, Window: 3600},
	)
}

// TestStatusNamedZones: named zones are answered in the order named, a
// name no handler of the config declares is left out and logged once, and
// the zones of a handler of another config (one being replaced) are never
// answered.
func TestStatusNamedZones(t *testing.T) {
	ctx := newConfig(t)
	provisionIn(t, ctx, nil, `rate_limit {
		zone st_a {
			rate 4/1h
		}
		zone st_b {
			rate 6/1h
		}
		zone st_c {
			rate 8/1h
		}
	}`)
	// The config being replaced declares st_a with another limit.
	provisionIn(t, newConfig(t), nil, "rate_limit {\n zone st_a {\n  rate 40/1h\n }\n zone st_only_old {\n  rate 1/1h\n }\n}")

	s := provisionStatus(t, ctx, "rate_limit_status st_b st_nope st_a st_only_old")
	core, logs := observer.New(zapcore.WarnLevel)
	s.logger = zap.New(core)
	for range 2 {
		got, _ := ask(t, s, "198.51.100.63", nil)
		wantStates(t, "named", got,
			zoneStatus{Zone: "st_b", Limit: 6, Remaining: 6, Window: 3600},
			zoneStatus{Zone: "st_a", Limit: 4, Remaining: 4, Window: 3600},
		)
	}
	var warned []string
	for _, e := range logs.All() {
		warned = append(warned, e.ContextMap()["zone"].(string))
	}
	if want := []string{"st_nope", "st_only_old"}; !reflect.DeepEqual(warned, want) {
		t.Errorf("warned about %v, want %v once each", warned, want)
	}

	all := provisionStatus(t, ctx, "rate_limit_status")
	got, _ := ask(t, all, "198.51.100.63", nil)
	var names []string
	for _, z := range got {
		names = append(names, z.Zone)
	}
	if want := []string{"st_a", "st_b", "st_c"}; !reflect.DeepEqual(names, want) {
		t.Errorf("every zone: %v, want %v", names, want)
	}
}

// TestStatusSharedName: a name two handlers of the config declare with one
// limit (one state) is answered once; with two limits, once for each.
func TestStatusSharedName(t *testing.T) {
	ctx := newConfig(t)
	same := "rate_limit {\n zone st_same {\n  rate 5/1h\n }\n}"
	h := provisionIn(t, ctx, nil, same)
	provisionIn(t, ctx, nil, same)
	provisionIn(t, ctx, nil, "rate_limit {\n zone st_two {\n  rate 5/1h\n }\n}")
	provisionIn(t, ctx, nil, "rate_limit {\n zone st_two {\n  rate 9/1h\n }\n}")
	spend(t, h, 1, "198.51.100.64", nil)
	s := provisionStatus(t, ctx, "rate_limit_status st_same st_two")
	got, _ := ask(t, s, "198.51.100.64", nil)
	if len(got) != 3 || got[0].Zone != "st_same" || got[0].Remaining != 4 ||
		got[1].Zone != "st_two" || got[1].Limit != 5 || got[2].Zone != "st_two" || got[2].Limit != 9 {
		t.Errorf("answered %+v; want st_same once (4 left), then st_two with 5 and with 9", got)
	}
}

// TestStatusTierAndMatch: the tier the client's request picks is the one
// answered, without naming it (a tier value may be a credential), and a
// zone's match does not hide it from a status request on another path.
func TestStatusTierAndMatch(t *testing.T) {
	ctx := newConfig(t)
	h := provisionIn(t, ctx, nil, `rate_limit {
		zone st_tiered {
			match {
				path /api/*
			}
			key header X-API-Key
			algorithm fixed_window
			rate 5/1h
			tier {http.request.header.X-Plan} {
				gold-plan-7 50/1h
			}
		}
	}`)
	s := provisionStatus(t, ctx, "rate_limit_status")
	gold := map[string]string{"X-API-Key": "k1", "X-Plan": "gold-plan-7"}
	spend(t, h, 2, "198.51.100.65", gold)
	got, body := ask(t, s, "198.51.100.65", gold)
	if len(got) != 1 || got[0].Limit != 50 || got[0].Remaining != 48 || got[0].Window != 3600 {
		t.Errorf("gold client: %+v, want the gold tier's 50 with 48 left", got)
	}
	if strings.Contains(body, "gold-plan-7") {
		t.Errorf("the answer %q names the tier", body)
	}
	got, _ = ask(t, s, "198.51.100.65", map[string]string{"X-API-Key": "k1"})
	if len(got) != 1 || got[0].Limit != 5 || got[0].Remaining != 5 {
		t.Errorf("the same key on no tier: %+v, want the zone's own 5, untouched", got)
	}
}

// TestStatusMissingKey: a client without the key is answered for the
// client-IP limit missing_key ip puts it under; with deny or skip, whose
// requests no key decides, the zone is left out.
func TestStatusMissingKey(t *testing.T) {
	ctx := newConfig(t)
	h := provisionIn(t, ctx, nil, `rate_limit {
		zone st_miss_ip {
			key header X-API-Key
			rate 5/1h
		}
		zone st_miss_deny {
			key header X-API-Key
			rate 5/1h
			missing_key deny
		}
		zone st_miss_skip {
			key header X-API-Key
			rate 5/1h
			missing_key skip
		}
	}`)
	// Two keyless requests, refused by st_miss_deny: st_miss_ip gives
	// back what it took. One with a key.
	for range 2 {
		r, _ := newKeyRequest("198.51.100.66", nil)
		if _, code := serve(h, r, okHandler); code != http.StatusTooManyRequests {
			t.Fatalf("keyless request: %d, want 429 from missing_key deny", code)
		}
	}
	spend(t, h, 1, "198.51.100.66", map[string]string{"X-API-Key": "k-miss"})
	s := provisionStatus(t, ctx, "rate_limit_status")
	got, _ := ask(t, s, "198.51.100.66", nil)
	wantStates(t, "keyless", got, zoneStatus{Zone: "st_miss_ip", Limit: 5, Remaining: 5, Window: 3600})
	got, _ = ask(t, s, "198.51.100.66", map[string]string{"X-API-Key": "k-miss"})
	if len(got) != 3 {
		t.Fatalf("with a key: %+v, want all three zones", got)
	}
	for _, z := range got {
		if z.Remaining != 4 {
			t.Errorf("with a key: %+v, want 4 left", z)
		}
	}
}

// TestStatusJWT: a zone keyed by a verified claim is answered from the
// token as its handler's jwt block verifies it; without a valid token the
// key is missing.
func TestStatusJWT(t *testing.T) {
	secret := []byte("status-secret-0123456789abcdef0123")
	ctx := newConfig(t)
	h := provisionIn(t, ctx, nil, `rate_limit {
		jwt {
			secret `+string(secret)+`
		}
		zone st_jwt {
			key jwt_claim sub
			algorithm sliding_window_counter
			rate 10/1m
			missing_key skip
			tier {jwt.plan} {
				pro 100/1m
			}
		}
	}`)
	s := provisionStatus(t, ctx, "rate_limit_status")
	tok := jwttest.Sign(t, jwt.SigningMethodHS256, secret, "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": "sub-7c1e", "plan": "pro"}))
	auth := map[string]string{"Authorization": "Bearer " + tok}
	spend(t, h, 3, "198.51.100.67", auth)
	got, body := ask(t, s, "198.51.100.67", auth)
	if len(got) != 1 || got[0].Limit != 100 || got[0].Remaining != 97 {
		t.Errorf("with the token: %+v, want the pro tier's 100 with 97 left", got)
	}
	if strings.Contains(body, "sub-7c1e") {
		t.Errorf("the answer %q shows the claim", body)
	}
	forged := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef0"), "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": "sub-7c1e"}))
	for what, hdr := range map[string]map[string]string{
		"no token":      nil,
		"forged token":  {"Authorization": "Bearer " + forged},
		"not a token":   {"Authorization": "Bearer x.y.z"},
		"other scheme":  {"Authorization": "Basic " + tok},
		"token in body": {"X-Token": tok},
	} {
		got, _ := ask(t, s, "198.51.100.67", hdr)
		wantStates(t, what, got)
	}
}

// TestStatusStoreFails: a redis zone whose store does not answer is left
// out, unless it fails local, whose in-memory fallback decides meanwhile
// and is answered.
func TestStatusStoreFails(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	ctx := newConfig(t)
	zone := func(name, fail string) string {
		return "zone " + name + " {\n rate 5/1h\n store redis\n fail " + fail + "\n}\n"
	}
	h := provisionIn(t, ctx, nil, "rate_limit {\n"+zone("st_red_open", "open")+zone("st_red_closed", "closed")+zone("st_red_local", "local")+
		"redis {\n addresses "+addr+"\n timeout 200ms\n}\n}")
	s := provisionStatus(t, ctx, "rate_limit_status st_red_open st_red_local")
	r, _ := newKeyRequest("198.51.100.68", nil)
	if _, code := serve(h, r, okHandler); code != http.StatusServiceUnavailable {
		t.Fatalf("request: %d, want 503 from fail closed", code)
	}
	got, _ := ask(t, s, "198.51.100.68", nil)
	// The refused request took nothing from the fallback.
	wantStates(t, "redis down", got, zoneStatus{Zone: "st_red_local", Limit: 5, Remaining: 5, Window: 3600})
}

// TestStatusMethods: HEAD answers the headers alone; other methods than
// GET and HEAD are refused with 405 and Allow.
func TestStatusMethods(t *testing.T) {
	ctx := newConfig(t)
	s := provisionStatus(t, ctx, "rate_limit_status")
	w := httptest.NewRecorder()
	if err := s.ServeHTTP(w, statusRequest(http.MethodHead, "198.51.100.69", nil), nil); err != nil || w.Code != 200 || w.Body.Len() != 0 {
		t.Errorf("HEAD: %v, %d, %q", err, w.Code, w.Body)
	}
	if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	w = httptest.NewRecorder()
	err := s.ServeHTTP(w, statusRequest(http.MethodPost, "198.51.100.69", nil), nil)
	var he caddyhttp.HandlerError
	if !asHandlerError(err, &he) || he.StatusCode != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %v, Allow %q; want 405 with Allow: GET, HEAD", err, w.Header().Get("Allow"))
	}
}

func asHandlerError(err error, he *caddyhttp.HandlerError) bool {
	h, ok := err.(caddyhttp.HandlerError)
	*he = h
	return ok
}

// TestStatusCaddyfile: the directive takes zone names and becomes the
// JSON handler; ordered after rate_limit and basic_auth and before respond,
// it needs no `order` line, even inside a handle.
func TestStatusCaddyfile(t *testing.T) {
	for input, want := range map[string][]string{
		"rate_limit_status":           nil,
		"rate_limit_status {\n}":      nil,
		"rate_limit_status api login": {"api", "login"},
	} {
		var s StatusHandler
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
			t.Errorf("%q: %v", input, err)
		} else if !reflect.DeepEqual(s.Zones, want) {
			t.Errorf("%q: zones %q, want %q", input, s.Zones, want)
		}
	}

	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, _, err := adapter.Adapt([]byte(`:8080 {
	handle /rate_limit {
		respond "never"
		rate_limit_status api
		basic_auth {
			user $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG
		}
		rate_limit {
			zone api {
				rate 5/s
			}
		}
	}
}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if !strings.Contains(s, `{"handler":"rate_limit_status","zones":["api"]}`) {
		t.Fatalf("no rate_limit_status handler in %s", s)
	}
	order := []string{`"handler":"rate_limit"`, `"handler":"authentication"`, `"handler":"rate_limit_status"`, `"handler":"static_response"`}
	at := -1
	for _, h := range order {
		i := strings.Index(s, h)
		if i < at {
			t.Fatalf("handlers not in the order %q: %s", order, s)
		}
		at = i
	}
}

// TestStatusJSONRefusals: in JSON as in the Caddyfile, a zone name given
// twice, or one no zone can have, is refused when the config loads.
func TestStatusJSONRefusals(t *testing.T) {
	for raw, want := range map[string]string{
		`{"zones":["api","login","api"]}`: "zone 'api' specified twice",
		`{"zones":["caf\u00e9"]}`:         "only printable ASCII",
		`{"zones":[""]}`:                  "a zone needs a name",
	} {
		var s StatusHandler
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			t.Fatal(err)
		}
		if err := s.Provision(newConfig(t)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a refusal with %q", raw, err, want)
		}
	}
}

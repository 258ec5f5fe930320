package ratelimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

// TestPlaceholdersTwoHandlers runs one request through two rate_limit
// handlers, each with a jwt block of its own, and checks that each keys its
// zone by what its own block verified and that later handlers see the
// second handler's decision, as they would with repl.Set.
func TestPlaceholdersTwoHandlers(t *testing.T) {
	k := jwttest.TestKeys(t)
	// The first handler trusts the test secret; the second only reads
	// claims, unverified. The token is signed with another secret, so
	// only the second handler's zone finds a subject.
	first := provisionHandler(t, "rate_limit {\n jwt {\n  secret "+string(k.HMAC)+"\n }\n zone first {\n  key jwt_claim sub\n  missing_key skip\n  events 10\n  window 1m\n }\n}")
	second := provisionHandler(t, "rate_limit {\n jwt {\n  allow_unverified\n }\n zone second {\n  key jwt_claim sub\n  missing_key deny\n  events 3\n  window 1m\n }\n}")
	var seen struct{ zone, remaining, sub string }
	var exceededKnown bool
	var repl *caddy.Replacer
	last := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		seen.zone, _ = repl.GetString("http.rate_limit.zone")
		seen.remaining, _ = repl.GetString("http.rate_limit.remaining")
		seen.sub, _ = repl.GetString("jwt.sub")
		_, exceededKnown = repl.Get("http.rate_limit.exceeded.name")
		return nil
	})
	chain := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return second.ServeHTTP(w, r, last)
	})

	// Signed with another secret: the first handler finds no subject and
	// skips its zone; the second reads alice, unverified.
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("another secret, 32 bytes long.."), "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": "alice"}))
	var r *http.Request
	r, repl = newKeyRequest("198.51.100.40", map[string]string{"Authorization": "Bearer " + token})
	if _, ok := repl.Get("http.rate_limit.zone"); ok {
		t.Fatal("http.rate_limit.zone is known before any decision")
	}
	if _, code := serve(first, r, chain); code != 200 {
		t.Fatalf("status %d, want 200", code)
	}
	if seen.zone != "second" || seen.remaining != "2" || seen.sub != "alice" || exceededKnown {
		t.Fatalf("later handler saw %+v (exceeded.name known: %v), want zone second, remaining 2, sub alice", seen, exceededKnown)
	}

	// With a token the first handler accepts, both zones decide, and the
	// second handler's decision and claims are what later handlers see.
	token = jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": "bob"}))
	r, repl = newKeyRequest("198.51.100.40", map[string]string{"Authorization": "Bearer " + token})
	if _, code := serve(first, r, chain); code != 200 {
		t.Fatalf("status %d, want 200", code)
	}
	if seen.zone != "second" || seen.remaining != "2" || seen.sub != "bob" || exceededKnown {
		t.Fatalf("later handler saw %+v (exceeded.name known: %v), want zone second, remaining 2, sub bob, no exceeded.name", seen, exceededKnown)
	}
}

// TestPlaceholdersRefusal checks what a refusal leaves for handle_errors
// routes: the refusing zone, its Retry-After, and exceeded.name.
func TestPlaceholdersRefusal(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone only {\n  events 1\n  window 1m\n }\n}")
	r, _ := newKeyRequest("198.51.100.41", nil)
	serve(h, r, okHandler)
	r, repl := newKeyRequest("198.51.100.41", nil)
	if _, code := serve(h, r, okHandler); code != 429 {
		t.Fatalf("status %d, want 429", code)
	}
	for name, want := range map[string]string{"zone": "only", "remaining": "0", "retry_after": "60", "exceeded.name": "only"} {
		if got, ok := repl.GetString("http.rate_limit." + name); !ok || got != want {
			t.Errorf("{http.rate_limit.%s} = %q (known: %v), want %q", name, got, ok, want)
		}
	}
	if _, ok := repl.Get("http.rate_limit.other"); ok {
		t.Error("an unknown http.rate_limit placeholder is known")
	}
}

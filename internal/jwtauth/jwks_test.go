package jwtauth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// wantFetches says whether v has fetched its JWKS n times.
func wantFetches(v *Verifier, n int64) error {
	if got := v.jwks.fetches.Load(); got != n {
		return fmt.Errorf("%d fetches, want %d", got, n)
	}
	return nil
}

func TestJWKSVerifiesEachKeyType(t *testing.T) {
	k := jwttest.TestKeys(t)
	srv := jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t,
		jwttest.RSAJWK("r", &k.RSA.PublicKey),
		jwttest.ECJWK(t, "e256", &k.EC256.PublicKey),
		jwttest.ECJWK(t, "e384", &k.EC384.PublicKey),
		jwttest.ECJWK(t, "e521", &k.EC521.PublicKey),
		jwttest.OKPJWK("ed", k.Ed.Public().(ed25519.PublicKey)),
		map[string]any{"kty": "oct", "kid": "h", "k": jwttest.B64(k.HMAC)},
		map[string]any{"kty": "RSA", "kid": "enc", "use": "enc", "n": jwttest.B64(k.RSA.N.Bytes()), "e": "AQAB"},
	))
	v := newVerifier(t, Options{JWKSURL: srv.URL, Audience: "floodgate"})
	now := time.Now()
	good := map[string]string{
		"RS256":        jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "r", jwttest.ClaimsAt(now, nil)),
		"PS512":        jwttest.Sign(t, jwt.SigningMethodPS512, k.RSA, "r", jwttest.ClaimsAt(now, nil)),
		"ES256":        jwttest.Sign(t, jwt.SigningMethodES256, k.EC256, "e256", jwttest.ClaimsAt(now, nil)),
		"ES384":        jwttest.Sign(t, jwt.SigningMethodES384, k.EC384, "e384", jwttest.ClaimsAt(now, nil)),
		"ES512":        jwttest.Sign(t, jwt.SigningMethodES512, k.EC521, "e521", jwttest.ClaimsAt(now, nil)),
		"EdDSA":        jwttest.Sign(t, jwt.SigningMethodEdDSA, k.Ed, "ed", jwttest.ClaimsAt(now, nil)),
		"EdDSA no kid": jwttest.Sign(t, jwt.SigningMethodEdDSA, k.Ed, "", jwttest.ClaimsAt(now, nil)),
		"ES256 no kid": jwttest.Sign(t, jwt.SigningMethodES256, k.EC256, "", jwttest.ClaimsAt(now, nil)),
	}
	for name, tok := range good {
		if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
			t.Errorf("%s: refused", name)
		}
	}
	bad := map[string]string{
		"ES256 under the RSA kid":     jwttest.Sign(t, jwt.SigningMethodES256, k.EC256, "r", jwttest.ClaimsAt(now, nil)),
		"ES384 under the P-256 kid":   jwttest.Sign(t, jwt.SigningMethodES384, k.EC384, "e256", jwttest.ClaimsAt(now, nil)),
		"HS256 keyed with the oct":    jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "h", jwttest.ClaimsAt(now, nil)),
		"HS256 keyed with RSA n":      jwttest.Sign(t, jwt.SigningMethodHS256, k.RSA.N.Bytes(), "r", jwttest.ClaimsAt(now, nil)),
		"RS256 under the enc kid":     jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "enc", jwttest.ClaimsAt(now, nil)),
		"wrong audience":              jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "r", jwttest.ClaimsAt(now, jwt.MapClaims{"aud": "other"})),
		"kid that is not a string":    jwttest.SignWithHeader(t, jwt.SigningMethodRS256, k.RSA, map[string]any{"kid": 5}, jwttest.ClaimsAt(now, nil)),
		"EdDSA signed by another key": jwttest.Sign(t, jwt.SigningMethodEdDSA, mustEd(t), "ed", jwttest.ClaimsAt(now, nil)),
	}
	for name, tok := range bad {
		if _, ok := v.Claims(jwttest.Bearer(tok)); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	set := v.jwks.current()
	if len(set.keys) != 5 {
		t.Errorf("usable keys = %d, want 5", len(set.keys))
	}
}

func TestJWKSRotation(t *testing.T) {
	k := jwttest.TestKeys(t)
	keyB, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	srv := jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t, jwttest.RSAJWK("a", &k.RSA.PublicKey)))
	v := newVerifier(t, Options{JWKSURL: srv.URL})
	now := time.Now()
	tokA := jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "a", jwttest.ClaimsAt(now, nil))
	tokB := jwttest.Sign(t, jwt.SigningMethodRS256, keyB, "b", jwttest.ClaimsAt(now, nil))
	if _, ok := v.Claims(jwttest.Bearer(tokA)); !ok {
		t.Fatal("token of the first key refused")
	}
	if got := srv.Hits.Load(); got != 1 {
		t.Fatalf("fetches after provision = %d, want 1", got)
	}

	// The provider rotates: only kid b remains.
	srv.Set(jwttest.JWKSDoc(t, jwttest.RSAJWK("b", &keyB.PublicKey)))
	start := time.Now()
	if _, ok := v.Claims(jwttest.Bearer(tokB)); ok {
		t.Fatal("the request that misses the kid must fail")
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("the missing request waited %s; the refetch must not block it", d)
	}
	testutil.Eventually(t, "the refetch", func() error {
		if n := len(v.jwks.current().byKid["b"]); n != 1 {
			return fmt.Errorf("%d keys with kid b", n)
		}
		return nil
	})
	if _, ok := v.Claims(jwttest.Bearer(tokB)); !ok {
		t.Fatal("token of the new key refused after the refetch")
	}
	// The old key is gone, and so is its cached verification.
	if _, ok := v.Claims(jwttest.Bearer(tokA)); ok {
		t.Fatal("token of the removed key still accepted")
	}

	// More unknown kids within the minute trigger no further fetch.
	fetches := srv.Hits.Load()
	for i := range 20 {
		tok := jwttest.Sign(t, jwt.SigningMethodRS256, keyB, "unknown-"+string(rune('a'+i)), jwttest.ClaimsAt(now, nil))
		if _, ok := v.Claims(jwttest.Bearer(tok)); ok {
			t.Fatal("unknown kid accepted")
		}
	}
	time.Sleep(50 * time.Millisecond)
	if got := srv.Hits.Load(); got != fetches {
		t.Fatalf("unknown kids caused %d more fetches within a minute, want 0", got-fetches)
	}
}

func TestJWKSRefetchRateLimitAllowsLaterMiss(t *testing.T) {
	k := jwttest.TestKeys(t)
	srv := jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t, jwttest.RSAJWK("a", &k.RSA.PublicKey)))
	clock := testutil.NewClock(time.Now())
	v := newVerifier(t, Options{JWKSURL: srv.URL, Clock: clock})
	tokWithJTI := func(jti int) string {
		return jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "x", jwttest.ClaimsAt(clock.Now(), jwt.MapClaims{"jti": jti}))
	}
	v.Claims(jwttest.Bearer(tokWithJTI(1)))
	testutil.Eventually(t, "the first refetch", func() error { return wantFetches(v, 2) })
	clock.Advance(30 * time.Second)
	v.Claims(jwttest.Bearer(tokWithJTI(2))) // another token, same missing kid: too soon
	time.Sleep(30 * time.Millisecond)
	if got := v.jwks.fetches.Load(); got != 2 {
		t.Fatalf("fetches = %d within the minute, want 2", got)
	}
	clock.Advance(31 * time.Second)
	v.Claims(jwttest.Bearer(tokWithJTI(3)))
	testutil.Eventually(t, "a refetch a minute later", func() error { return wantFetches(v, 3) })
}

func TestJWKSBackgroundRefreshAndClose(t *testing.T) {
	k := jwttest.TestKeys(t)
	srv := jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t, jwttest.RSAJWK("a", &k.RSA.PublicKey)))
	cfg := Options{JWKSURL: srv.URL, JWKSRefresh: 10 * time.Millisecond}
	v := newVerifier(t, cfg)
	testutil.Eventually(t, "background refreshes", func() error {
		if n := srv.Hits.Load(); n < 4 {
			return fmt.Errorf("%d fetches", n)
		}
		return nil
	})
	// An unchanged document keeps the generation, so cached tokens survive.
	if gen := v.jwks.current().gen; gen != 1 {
		t.Errorf("generation = %d after unchanged refreshes, want 1", gen)
	}
	v.Close()
	select {
	case <-v.jwks.done:
	default:
		t.Fatal("refresh goroutine still running after close")
	}
	after := srv.Hits.Load()
	time.Sleep(50 * time.Millisecond)
	if got := srv.Hits.Load(); got != after {
		t.Fatalf("%d fetches after close", got-after)
	}
	v.Close() // idempotent
}

func TestJWKSInitialFailureRecovers(t *testing.T) {
	k := jwttest.TestKeys(t)
	srv := jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t, jwttest.RSAJWK("a", &k.RSA.PublicKey)))
	srv.Fail.Store(2)
	v := newVerifier(t, Options{JWKSURL: srv.URL, JWKSRetryMin: 10 * time.Millisecond, JWKSMissInterval: time.Hour})
	tok := jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "a", jwttest.ClaimsAt(time.Now(), nil))
	if len(v.jwks.current().keys) != 0 {
		t.Fatal("keys loaded although the first fetch failed")
	}
	testutil.Eventually(t, "verification after the retries", func() error {
		if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
			return fmt.Errorf("token refused after %d fetches", srv.Hits.Load())
		}
		return nil
	})
	if got := srv.Hits.Load(); got != 3 {
		t.Errorf("fetches = %d, want 3 (two failures, one success)", got)
	}
}

func TestJWKSUnreachableAndSlow(t *testing.T) {
	// Nothing listens on this port once the server is closed.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	v := newVerifier(t, Options{JWKSURL: deadURL})
	if _, ok := v.Claims(jwttest.Bearer("eyJhbGciOiJSUzI1NiIsImtpZCI6ImEifQ.e30.c2ln")); ok {
		t.Fatal("accepted without keys")
	}

	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	start := time.Now()
	v2 := newVerifier(t, Options{JWKSURL: slow.URL, HTTPClient: &http.Client{Timeout: 100 * time.Millisecond}})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("provision waited %s for a hanging JWKS", d)
	}
	start = time.Now()
	v2.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("close waited %s", d)
	}
}

func TestJWKSFetchKeepsKeysOnFailure(t *testing.T) {
	k := jwttest.TestKeys(t)
	var body atomic.Value
	status := atomic.Int64{}
	status.Store(200)
	body.Store(jwttest.JWKSDoc(t, jwttest.RSAJWK("a", &k.RSA.PublicKey)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write(body.Load().([]byte))
	}))
	t.Cleanup(srv.Close)
	src := newJWKSSource(&Options{JWKSURL: srv.URL, HTTPClient: &http.Client{Timeout: time.Second}}, limiter.SystemClock, zap.NewNop())
	ctx := context.Background()
	if err := src.fetch(ctx); err != nil {
		t.Fatal(err)
	}
	failures := map[string]func(){
		"status":    func() { status.Store(503) },
		"too large": func() { body.Store([]byte(`{"keys":[],"pad":"` + strings.Repeat("x", maxJWKSBody) + `"}`)) },
		"not json":  func() { body.Store([]byte("<html>")) },
		"no keys":   func() { body.Store([]byte(`{"keys":[]}`)) },
		"only bad":  func() { body.Store([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}, 5]}`)) },
	}
	for name, breakIt := range failures {
		status.Store(200)
		breakIt()
		if err := src.fetch(ctx); err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.Contains(err.Error(), srv.URL) {
			t.Errorf("%s: error %q does not name the URL", name, err)
		}
		if set := src.current(); len(set.keys) != 1 || set.gen != 1 {
			t.Errorf("%s: key set replaced by a failed fetch", name)
		}
	}
}

func mustEd(t *testing.T) ed25519.PrivateKey {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

package ratelimit

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/golang-jwt/jwt/v5"
)

// testClock is a settable clock for exact exp/nbf and cache-expiry tests.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.ns.Store(t.UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// testKeys holds one key of every kind, generated once per test binary.
type testKeys struct {
	rsa     *rsa.PrivateKey
	ec256   *ecdsa.PrivateKey
	ec384   *ecdsa.PrivateKey
	ec521   *ecdsa.PrivateKey
	ed      ed25519.PrivateKey
	hmac    []byte
	rsaPEM  []byte
	ec256PE []byte
	ec384PE []byte
	edPEM   []byte
}

var (
	testKeysOnce sync.Once
	testKeySet   *testKeys
)

func keys(tb testing.TB) *testKeys {
	tb.Helper()
	testKeysOnce.Do(func() {
		k := &testKeys{hmac: []byte("0123456789abcdef0123456789abcdef")}
		var err error
		if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if k.ec256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
			panic(err)
		}
		if k.ec521, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader); err != nil {
			panic(err)
		}
		if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
			panic(err)
		}
		k.rsaPEM = pemPublic(k.rsa.Public())
		k.ec256PE = pemPublic(k.ec256.Public())
		k.ec384PE = pemPublic(k.ec384.Public())
		k.edPEM = pemPublic(k.ed.Public())
		testKeySet = k
	})
	return testKeySet
}

func pemPublic(pub crypto.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func writePEM(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sign makes a token; kid is set in the header when non-empty.
func sign(tb testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	tb.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		tb.Fatalf("signing %s: %v", m.Alg(), err)
	}
	return s
}

// claimsAt returns standard claims valid around at.
func claimsAt(at time.Time, extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": "user-1",
		"iss": "https://issuer.test",
		"aud": "floodgate",
		"iat": at.Unix(),
		"exp": at.Add(time.Hour).Unix(),
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

func provisionJWT(tb testing.TB, cfg *JWTConfig) *jwtVerifier {
	tb.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	v, err := cfg.provision(ctx, nil)
	if err != nil {
		cancel()
		tb.Fatalf("provision: %v", err)
	}
	tb.Cleanup(func() {
		v.close()
		cancel()
	})
	return v
}

func bearer(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func TestJWTVerifiesEachKeyType(t *testing.T) {
	k := keys(t)
	cases := []struct {
		name   string
		cfg    func(t *testing.T) *JWTConfig
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", func(*testing.T) *JWTConfig { return &JWTConfig{Secret: string(k.hmac)} }, jwt.SigningMethodHS256, k.hmac},
		{"HS512", func(*testing.T) *JWTConfig { return &JWTConfig{Secret: string(k.hmac)} }, jwt.SigningMethodHS512, k.hmac},
		{"RS256", func(t *testing.T) *JWTConfig { return &JWTConfig{PublicKey: writePEM(t, k.rsaPEM)} }, jwt.SigningMethodRS256, k.rsa},
		{"PS384", func(t *testing.T) *JWTConfig { return &JWTConfig{PublicKey: writePEM(t, k.rsaPEM)} }, jwt.SigningMethodPS384, k.rsa},
		{"ES256", func(t *testing.T) *JWTConfig { return &JWTConfig{PublicKey: writePEM(t, k.ec256PE)} }, jwt.SigningMethodES256, k.ec256},
		{"ES384", func(t *testing.T) *JWTConfig { return &JWTConfig{PublicKey: writePEM(t, k.ec384PE)} }, jwt.SigningMethodES384, k.ec384},
		{"EdDSA", func(t *testing.T) *JWTConfig { return &JWTConfig{PublicKey: writePEM(t, k.edPEM)} }, jwt.SigningMethodEdDSA, k.ed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := newTestClock(testEpoch)
			cfg := tc.cfg(t)
			cfg.Issuer, cfg.Audience, cfg.now = "https://issuer.test", "floodgate", clock.now
			v := provisionJWT(t, cfg)
			tok := sign(t, tc.method, tc.key, "", claimsAt(testEpoch, jwt.MapClaims{"org": map[string]any{"id": 42}}))
			c, ok := v.claims(bearer(tok))
			if !ok {
				t.Fatalf("valid %s token refused", tc.name)
			}
			if got, _ := lookupClaim(c, "sub"); got != "user-1" {
				t.Errorf("sub = %q", got)
			}
			if got, _ := lookupClaim(c, "org.id"); got != "42" {
				t.Errorf("org.id = %q", got)
			}
		})
	}
}

func TestJWTRejects(t *testing.T) {
	k := keys(t)
	clock := newTestClock(testEpoch)
	rsaCfg := func() *JWTConfig {
		return &JWTConfig{PublicKey: writePEM(t, k.rsaPEM), Issuer: "https://issuer.test", Audience: "floodgate", now: clock.now}
	}
	hmacCfg := &JWTConfig{Secret: string(k.hmac), Issuer: "https://issuer.test", Audience: "floodgate", now: clock.now}
	ecCfg := &JWTConfig{PublicKey: writePEM(t, k.ec256PE), now: clock.now}
	edCfg := &JWTConfig{PublicKey: writePEM(t, k.edPEM), now: clock.now}
	rsaV, hmacV, ecV, edV := provisionJWT(t, rsaCfg()), provisionJWT(t, hmacCfg), provisionJWT(t, ecCfg), provisionJWT(t, edCfg)

	good := sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, nil))
	otherRSA, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claimsAt(testEpoch, nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	// Same header and claims, signature of another token: a forgery.
	other := strings.Split(sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"sub": "admin"})), ".")
	forged := other[0] + "." + other[1] + "." + parts[2]

	cases := []struct {
		name  string
		v     *jwtVerifier
		token string
	}{
		{"forged signature", rsaV, forged},
		{"signed by another key", rsaV, sign(t, jwt.SigningMethodRS256, otherRSA, "", claimsAt(testEpoch, nil))},
		{"alg none (RSA config)", rsaV, none},
		{"alg none (HMAC config)", hmacV, none},
		{"alg none with the good signature", rsaV, none + parts[2]},
		{"expired beyond leeway", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"exp": testEpoch.Add(-31 * time.Second).Unix()}))},
		{"not yet valid beyond leeway", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"nbf": testEpoch.Add(31 * time.Second).Unix()}))},
		{"wrong issuer", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"iss": "https://evil.test"}))},
		{"missing issuer", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"iss": nil}))},
		{"wrong audience", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"aud": []string{"a", "b"}}))},
		{"missing audience", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"aud": nil}))},
		{"exp of the wrong type", rsaV, sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, jwt.MapClaims{"exp": "tomorrow"}))},
		{"HMAC keyed with the RSA public key (alg confusion)", rsaV, sign(t, jwt.SigningMethodHS256, k.rsaPEM, "", claimsAt(testEpoch, nil))},
		{"HMAC keyed with the EC public key (alg confusion)", ecV, sign(t, jwt.SigningMethodHS256, k.ec256PE, "", claimsAt(testEpoch, nil))},
		{"RS256 token to an HMAC config", hmacV, good},
		{"ES384 token to a P-256 key", ecV, sign(t, jwt.SigningMethodES384, k.ec384, "", claimsAt(testEpoch, nil))},
		{"ES512 token to an Ed25519 key", edV, sign(t, jwt.SigningMethodES512, k.ec521, "", claimsAt(testEpoch, nil))},
		{"truncated", rsaV, good[:len(good)-10]},
		{"two segments", rsaV, parts[0] + "." + parts[1]},
		{"four segments", rsaV, good + ".x"},
		{"garbage", rsaV, "not a token"},
		{"padded base64", rsaV, parts[0] + "=." + parts[1] + "." + parts[2]},
		{"too long", hmacV, sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(testEpoch, jwt.MapClaims{"pad": strings.Repeat("x", jwtMaxTokenLen)}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 2 { // the second answer comes from the failure cache
				if c, ok := tc.v.claims(bearer(tc.token)); ok || c != nil {
					t.Fatalf("attempt %d: accepted: %v", i, c)
				}
			}
		})
	}
	if _, ok := rsaV.claims(bearer(good)); !ok {
		t.Fatal("the good token is refused")
	}
	// Within the leeway on both sides.
	for _, extra := range []jwt.MapClaims{
		{"exp": testEpoch.Add(-29 * time.Second).Unix()},
		{"nbf": testEpoch.Add(29 * time.Second).Unix()},
	} {
		if _, ok := rsaV.claims(bearer(sign(t, jwt.SigningMethodRS256, k.rsa, "", claimsAt(testEpoch, extra)))); !ok {
			t.Errorf("token %v within the leeway refused", extra)
		}
	}
	if n := rsaV.panics.Load() + hmacV.panics.Load() + ecV.panics.Load() + edV.panics.Load(); n != 0 {
		t.Errorf("%d panics recovered", n)
	}
}

func TestJWTTokenSources(t *testing.T) {
	k := keys(t)
	tok := sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(time.Now(), nil))
	cases := []struct {
		name string
		from *TokenSource
		req  func() *http.Request
		ok   bool
	}{
		{"default bearer", nil, func() *http.Request { return bearer(tok) }, true},
		{"default bearer, lower-case scheme", nil, func() *http.Request {
			r := bearer("")
			r.Header.Set("Authorization", "bearer   "+tok)
			return r
		}, true},
		{"default without the Bearer scheme", nil, func() *http.Request {
			r := bearer("")
			r.Header.Set("Authorization", tok)
			return r
		}, false},
		{"default with the Basic scheme", nil, func() *http.Request {
			r := bearer("")
			r.SetBasicAuth("user", "pass")
			return r
		}, false},
		{"no token", nil, func() *http.Request { return bearer("") }, false},
		{"header", &TokenSource{Header: "x-api-token"}, func() *http.Request {
			r := bearer("")
			r.Header.Set("X-Api-Token", tok)
			return r
		}, true},
		{"header with a Bearer prefix", &TokenSource{Header: "X-Api-Token"}, func() *http.Request {
			r := bearer("")
			r.Header.Set("X-Api-Token", "Bearer "+tok)
			return r
		}, true},
		{"header source ignores Authorization", &TokenSource{Header: "X-Api-Token"}, func() *http.Request { return bearer(tok) }, false},
		{"cookie", &TokenSource{Cookie: "session"}, func() *http.Request {
			r := bearer("")
			r.AddCookie(&http.Cookie{Name: "other", Value: "x"})
			r.AddCookie(&http.Cookie{Name: "session", Value: tok})
			return r
		}, true},
		{"cookie missing", &TokenSource{Cookie: "session"}, func() *http.Request { return bearer(tok) }, false},
		{"query", &TokenSource{Query: "access_token"}, func() *http.Request {
			return httptest.NewRequest(http.MethodGet, "http://example.test/p?a=1&access_token="+tok, nil)
		}, true},
		{"query missing", &TokenSource{Query: "access_token"}, func() *http.Request {
			return httptest.NewRequest(http.MethodGet, "http://example.test/p?token="+tok, nil)
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := provisionJWT(t, &JWTConfig{Secret: string(k.hmac), From: tc.from})
			c, ok := v.claims(tc.req())
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && c["sub"] != "user-1" {
				t.Errorf("claims = %v", c)
			}
		})
	}
	var nilV *jwtVerifier
	if _, ok := nilV.claims(bearer(tok)); ok {
		t.Error("nil verifier accepted a token")
	}
	nilV.close()
}

func TestQueryValueMatchesURLValues(t *testing.T) {
	for _, q := range []string{
		"", "t=a", "a=1&t=b&t=c", "t", "t=", "x=1;t=2&t=3", "t%3D=1&t=2", "%74=esc", "t=a%2Bb+c",
		"t=%zz&t=ok", "%zz=1&t=ok", "&&t=x&&", "tt=1&t=2", "t=a=b",
	} {
		want := ""
		if vals, _ := url.ParseQuery(q); len(vals["t"]) > 0 {
			want = vals["t"][0]
		}
		if got := queryValue(q, "t"); got != want {
			t.Errorf("queryValue(%q) = %q, url.Values gives %q", q, got, want)
		}
	}
}

func TestJWTAllowUnverified(t *testing.T) {
	clock := newTestClock(testEpoch)
	v := provisionJWT(t, &JWTConfig{AllowUnverified: true, Issuer: "https://issuer.test", now: clock.now})
	anyKey := []byte("a key nobody configured anywhere")
	if c, ok := v.claims(bearer(sign(t, jwt.SigningMethodHS256, anyKey, "", claimsAt(testEpoch, nil)))); !ok || c["sub"] != "user-1" {
		t.Fatalf("unverified token refused: %v %v", c, ok)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claimsAt(testEpoch, nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"alg none":     none,
		"expired":      sign(t, jwt.SigningMethodHS256, anyKey, "", claimsAt(testEpoch, jwt.MapClaims{"exp": testEpoch.Add(-time.Hour).Unix()})),
		"not yet":      sign(t, jwt.SigningMethodHS256, anyKey, "", claimsAt(testEpoch, jwt.MapClaims{"nbf": testEpoch.Add(time.Hour).Unix()})),
		"wrong issuer": sign(t, jwt.SigningMethodHS256, anyKey, "", claimsAt(testEpoch, jwt.MapClaims{"iss": "x"})),
		"unknown alg":  "eyJhbGciOiJYWTEyIn0.eyJzdWIiOiJ4In0.c2ln",
		"garbage":      "a.b.c",
	} {
		if _, ok := v.claims(bearer(tok)); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestJWTCacheAvoidsReverification(t *testing.T) {
	k := keys(t)
	clock := newTestClock(testEpoch)
	v := provisionJWT(t, &JWTConfig{Secret: string(k.hmac), Leeway: caddy.Duration(10 * time.Second), now: clock.now})
	tok := sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(testEpoch, jwt.MapClaims{"exp": testEpoch.Add(2 * time.Minute).Unix()}))
	for range 5 {
		if _, ok := v.claims(bearer(tok)); !ok {
			t.Fatal("refused")
		}
	}
	if n := v.verifyMisses.Load(); n != 1 {
		t.Fatalf("verified %d times, want 1", n)
	}
	// Still valid just before exp+leeway, from the cache.
	clock.advance(2*time.Minute + 9*time.Second)
	if _, ok := v.claims(bearer(tok)); !ok {
		t.Fatal("refused within leeway")
	}
	if n := v.verifyMisses.Load(); n != 1 {
		t.Fatalf("verified %d times, want 1", n)
	}
	// Past exp+leeway the cached entry is dead and verification fails.
	clock.advance(2 * time.Second)
	if _, ok := v.claims(bearer(tok)); ok {
		t.Fatal("expired token served from the cache")
	}

	// Failures are cached briefly and never yield claims.
	bad := tok[:len(tok)-2] + "AA"
	before := v.verifyMisses.Load()
	for range 5 {
		if c, ok := v.claims(bearer(bad)); ok || c != nil {
			t.Fatal("bad token accepted")
		}
	}
	if n := v.verifyMisses.Load() - before; n != 1 {
		t.Fatalf("bad token verified %d times, want 1", n)
	}
	clock.advance(jwtFailureTTL)
	v.claims(bearer(bad))
	if n := v.verifyMisses.Load() - before; n != 2 {
		t.Fatalf("bad token verified %d times after the failure TTL, want 2", n)
	}

	// A token without exp is cached no longer than the static cap.
	noExp := sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(clock.now(), jwt.MapClaims{"exp": nil}))
	v.claims(bearer(noExp))
	before = v.verifyMisses.Load()
	clock.advance(jwtStaticCacheTTL - time.Second)
	v.claims(bearer(noExp))
	clock.advance(2 * time.Second)
	if _, ok := v.claims(bearer(noExp)); !ok {
		t.Fatal("token without exp refused")
	}
	if n := v.verifyMisses.Load() - before; n != 1 {
		t.Fatalf("re-verifications after the cache cap = %d, want 1", n)
	}
}

func TestJWTCacheBoundsAndKeys(t *testing.T) {
	c := newJWTCache(64)
	claims := map[string]any{"sub": "x"}
	for i := range 10000 {
		tok := fmt.Sprintf("token-%d", i)
		c.put(uint64(i)*0x9E3779B97F4A7C15, tok, claims, int64(i+1000), 0)
	}
	if n := c.len(); n > 64+jwtCacheShards || n < 32 {
		t.Fatalf("cache holds %d entries, bound 64", n)
	}
	// Same hash, different token: a miss, never the other token's claims.
	c.put(7, "token-a", claims, 1<<62, 0)
	if _, hit := c.get(7, "token-b", 0, 0); hit {
		t.Fatal("hash collision returned another token's claims")
	}
	if got, hit := c.get(7, "token-a", 0, 0); !hit || got["sub"] != "x" {
		t.Fatal("stored entry not found")
	}
	// Another key set generation or a passed expiry is a miss.
	if _, hit := c.get(7, "token-a", 0, 1); hit {
		t.Fatal("entry of an old generation served")
	}
	if _, hit := c.get(7, "token-a", 1<<62, 0); hit {
		t.Fatal("expired entry served")
	}
	// Eviction takes the entry that expires first (or one of an old key
	// set generation).
	small := newJWTCache(2 * jwtCacheShards) // two entries per shard
	small.put(0, "long", claims, 1000, 0)
	small.put(jwtCacheShards, "short", claims, 10, 0)
	small.put(2*jwtCacheShards, "new", claims, 500, 0) // same shard: evicts "short"
	for h, tok := range map[uint64]string{0: "long", 2 * jwtCacheShards: "new"} {
		if _, hit := small.get(h, tok, 0, 0); !hit {
			t.Errorf("%s evicted", tok)
		}
	}
	if _, hit := small.get(jwtCacheShards, "short", 0, 0); hit {
		t.Error("the entry closest to expiry survived")
	}
	small.put(3*jwtCacheShards, "gen1", claims, 10, 1) // evicts an entry of generation 0
	if small.len() != 2 {
		t.Fatalf("shard over its bound: %d", small.len())
	}
}

func TestJWTVerifierCacheBounded(t *testing.T) {
	k := keys(t)
	v := provisionJWT(t, &JWTConfig{Secret: string(k.hmac)})
	now := time.Now()
	for i := range jwtCacheSize + 2000 {
		tok := sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(now, jwt.MapClaims{"jti": i}))
		if _, ok := v.claims(bearer(tok)); !ok {
			t.Fatal("refused")
		}
		v.claims(bearer(tok + "x")) // a failure each time
	}
	limit := (jwtCacheSize/jwtCacheShards + 1) * jwtCacheShards
	if n := v.good.len(); n > limit {
		t.Errorf("verified cache holds %d, bound %d", n, limit)
	}
	if n := v.bad.len(); n > jwtFailureCacheSize+jwtCacheShards {
		t.Errorf("failure cache holds %d, bound %d", n, jwtFailureCacheSize)
	}
}

func TestJWTConcurrentClaims(t *testing.T) {
	k := keys(t)
	v := provisionJWT(t, &JWTConfig{Secret: string(k.hmac)})
	toks := make([]string, 20)
	for i := range toks {
		toks[i] = sign(t, jwt.SigningMethodHS256, k.hmac, "", claimsAt(time.Now(), jwt.MapClaims{"sub": fmt.Sprint(i)}))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				j := (i + g) % len(toks)
				c, ok := v.claims(bearer(toks[j]))
				if sub, _ := lookupClaim(c, "sub"); !ok || sub != fmt.Sprint(j) {
					t.Errorf("token %d: ok=%v sub=%q", j, ok, sub)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestJWTProvisionErrors(t *testing.T) {
	t.Setenv("FLOODGATE_TEST_JWT_SECRET", "from-the-environment-0123456789abcdef")
	v := provisionJWT(t, &JWTConfig{Secret: "{env.FLOODGATE_TEST_JWT_SECRET}"})
	tok := sign(t, jwt.SigningMethodHS256, []byte("from-the-environment-0123456789abcdef"), "", claimsAt(time.Now(), nil))
	if _, ok := v.claims(bearer(tok)); !ok {
		t.Fatal("secret from the environment not used")
	}
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	privPath := filepath.Join(dir, "priv.pem")
	der, _ := x509.MarshalPKCS8PrivateKey(keys(t).ec256)
	if err := os.WriteFile(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for name, cfg := range map[string]*JWTConfig{
		"unset env var":   {Secret: "{env.FLOODGATE_TEST_UNSET_VARIABLE}"},
		"missing file":    {PublicKey: filepath.Join(dir, "nope.pem")},
		"not PEM":         {PublicKey: notPEM},
		"private key PEM": {PublicKey: privPath},
		"invalid config":  {},
	} {
		if v, err := cfg.provision(ctx, nil); err == nil {
			v.close()
			t.Errorf("%s: no error", name)
		}
	}
}

func TestJWTValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  JWTConfig
		ok   bool
	}{
		{"secret", JWTConfig{Secret: "s"}, true},
		{"public key", JWTConfig{PublicKey: "k.pem"}, true},
		{"jwks", JWTConfig{JWKSURL: "https://idp.test/jwks.json", JWKSRefresh: caddy.Duration(time.Hour)}, true},
		{"unverified", JWTConfig{AllowUnverified: true, Issuer: "i"}, true},
		{"nothing", JWTConfig{}, false},
		{"two keys", JWTConfig{Secret: "s", PublicKey: "k.pem"}, false},
		{"three keys", JWTConfig{Secret: "s", PublicKey: "k.pem", JWKSURL: "https://idp.test/"}, false},
		{"unverified with a key", JWTConfig{AllowUnverified: true, Secret: "s"}, false},
		{"empty from", JWTConfig{Secret: "s", From: &TokenSource{}}, false},
		{"two sources", JWTConfig{Secret: "s", From: &TokenSource{Header: "a", Cookie: "b"}}, false},
		{"cookie source", JWTConfig{Secret: "s", From: &TokenSource{Cookie: "b"}}, true},
		{"negative leeway", JWTConfig{Secret: "s", Leeway: -1}, false},
		{"negative refresh", JWTConfig{JWKSURL: "https://idp.test/", JWKSRefresh: -1}, false},
		{"refresh without jwks", JWTConfig{Secret: "s", JWKSRefresh: caddy.Duration(time.Hour)}, false},
		{"relative jwks url", JWTConfig{JWKSURL: "/jwks.json"}, false},
		{"ftp jwks url", JWTConfig{JWKSURL: "ftp://idp.test/jwks.json"}, false},
		{"bad jwks url", JWTConfig{JWKSURL: "http://[::1"}, false},
	}
	for _, tc := range cases {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestJWTUnmarshalCaddyfile(t *testing.T) {
	full := `rate_limit {
	jwt {
		from cookie session
		secret {env.JWT_SECRET}
		issuer https://issuer.test
		audience floodgate
		leeway 1m
	}
	zone api
}`
	d := caddyfile.NewTestDispenser(full)
	d.Next() // rate_limit
	if !d.NextBlock(0) || d.Val() != "jwt" {
		t.Fatalf("positioned on %q", d.Val())
	}
	var j JWTConfig
	if err := j.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	want := JWTConfig{From: &TokenSource{Cookie: "session"}, Secret: "{env.JWT_SECRET}", Issuer: "https://issuer.test", Audience: "floodgate", Leeway: caddy.Duration(time.Minute)}
	gotJSON, _ := json.Marshal(j)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Fatalf("got %s\nwant %s", gotJSON, wantJSON)
	}
	// The handler's loop continues after the block.
	if !d.NextBlock(0) || d.Val() != "zone" {
		t.Fatalf("after jwt, positioned on %q", d.Val())
	}

	other := `jwt {
	from header X-Token
	jwks_url https://idp.test/jwks.json
	jwks_refresh 10m
}`
	var j2 JWTConfig
	if err := j2.UnmarshalCaddyfile(caddyfile.NewTestDispenser(other)); err != nil {
		t.Fatal(err)
	}
	if j2.From.Header != "X-Token" || j2.JWKSURL != "https://idp.test/jwks.json" || j2.JWKSRefresh != caddy.Duration(10*time.Minute) {
		t.Fatalf("parsed %+v", j2)
	}
	var j3 JWTConfig
	if err := j3.UnmarshalCaddyfile(caddyfile.NewTestDispenser("jwt {\n\tallow_unverified\n\tfrom query t\n}")); err != nil || !j3.AllowUnverified || j3.From.Query != "t" {
		t.Fatalf("parsed %+v, %v", j3, err)
	}

	bad := []struct{ name, input, line string }{
		{"unknown", "jwt {\n\tsecret s\n\tfoo bar\n}", ":3"},
		{"repeated", "jwt {\n\tsecret s\n\tsecret t\n}", ":3"},
		{"missing value", "jwt {\n\tsecret\n}", ":2"},
		{"extra value", "jwt {\n\tissuer a b\n}", ":2"},
		{"from kind", "jwt {\n\tfrom body x\n}", ":2"},
		{"from no name", "jwt {\n\tfrom header\n}", ":2"},
		{"bad duration", "jwt {\n\tleeway soon\n}", ":2"},
		{"flag with value", "jwt {\n\tallow_unverified yes\n}", ":2"},
		{"argument on jwt", "jwt foo {\n}", ":1"},
		{"not jwt", "zone {\n}", ":1"},
	}
	for _, tc := range bad {
		var j JWTConfig
		err := j.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), "Testfile"+tc.line) {
			t.Errorf("%s: error %q lacks line %s", tc.name, err, tc.line)
		}
	}
}

func TestLookupClaim(t *testing.T) {
	var claims map[string]any
	dec := json.NewDecoder(strings.NewReader(`{
		"sub": "alice", "empty": "", "n": 42, "big": 12345678901234567890, "f": 1.50,
		"e": 1e3, "neg": -0.0, "small": 1.5e-7, "exp": 2.5E+2, "t": true, "no": false,
		"null": null, "arr": [1], "obj": {"id": "o-1", "n": 7.0, "deep": {"x": "y"}},
		"https://ns.test/org": "acme", "a": {"b.c": "dotted"}
	}`))
	dec.UseNumber()
	if err := dec.Decode(&claims); err != nil {
		t.Fatal(err)
	}
	claims["float"] = 3.0
	claims["float_frac"] = 0.25
	claims["float_big"] = 1e21
	claims["nan"] = nan()
	claims["int"] = 7
	cases := []struct {
		path string
		want string
		ok   bool
	}{
		{"sub", "alice", true},
		{"empty", "", true},
		{"n", "42", true},
		{"big", "12345678901234567890", true},
		{"f", "1.5", true},
		{"e", "1000", true},
		{"neg", "0", true},
		{"small", "0.00000015", true},
		{"exp", "250", true},
		{"t", "true", true},
		{"no", "false", true},
		{"null", "", false},
		{"arr", "", false},
		{"obj", "", false},
		{"obj.id", "o-1", true},
		{"obj.n", "7", true},
		{"obj.deep.x", "y", true},
		{"obj.deep", "", false},
		{"obj.missing", "", false},
		{"sub.x", "", false},
		{"missing", "", false},
		{"", "", false},
		{".", "", false},
		{"obj.", "", false},
		{".obj", "", false},
		{"obj..id", "", false},
		{"https://ns.test/org", "acme", true},
		{"a.b.c", "", false},
		{"float", "3", true},
		{"float_frac", "0.25", true},
		{"float_big", "1000000000000000000000", true},
		{"nan", "", false},
		{"int", "7", true},
	}
	for _, tc := range cases {
		got, ok := lookupClaim(claims, tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("lookupClaim(%q) = %q, %v; want %q, %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := lookupClaim(nil, "sub"); ok {
		t.Error("nil claims gave a value")
	}
	if got, ok := lookupClaim(map[string]any{"o": jwt.MapClaims{"x": "y"}}, "o.x"); !ok || got != "y" {
		t.Errorf("MapClaims nested: %q %v", got, ok)
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestRenderDecimal(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"0", "0", true},
		{"-0", "0", true},
		{"0.000", "0", true},
		{"-0e5", "0", true},
		{"10", "10", true},
		{"100e-2", "1", true},
		{"1.0", "1", true},
		{"-1.50", "-1.5", true},
		{"1E2", "100", true},
		{"1e+2", "100", true},
		{"123.456e1", "1234.56", true},
		{"123.456e-5", "0.00123456", true},
		{"0.001e3", "1", true},
		{"00012", "12", true},
		{"9007199254740993", "9007199254740993", true},
		{"1e400", "1" + strings.Repeat("0", 400), true},
		{"1e401", "", false},
		{"1e-400", "0." + strings.Repeat("0", 399) + "1", true},
		{"1e-402", "", false},
		{"1e999999999999999999", "", false},
		{"", "", false},
		{"-", "", false},
		{"1.", "", false},
		{".5", "", false},
		{"1e", "", false},
		{"1e+", "", false},
		{"+1", "", false},
		{"1x", "", false},
		{"NaN", "", false},
	}
	for _, tc := range cases {
		got, ok := renderDecimal(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("renderDecimal(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// Benchmarks. BenchmarkNoToken is the baseline: a request without a token.
// BenchmarkJWTCached repeats one token; BenchmarkJWTFirstSight verifies
// tokens the cache has not seen (the cache is cleared, timer stopped, each
// time the pool of distinct tokens is used up).

func benchVerifier(b *testing.B, cfg *JWTConfig) *jwtVerifier {
	b.Helper()
	return provisionJWT(b, cfg)
}

func BenchmarkNoToken(b *testing.B) {
	v := benchVerifier(b, &JWTConfig{Secret: string(keys(b).hmac)})
	r := bearer("")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := v.claims(r); ok {
			b.Fatal("claims without a token")
		}
	}
}

func BenchmarkJWTCached(b *testing.B) {
	k := keys(b)
	v := benchVerifier(b, pemConfig(b, k.rsaPEM))
	r := bearer(sign(b, jwt.SigningMethodRS256, k.rsa, "", claimsAt(time.Now(), jwt.MapClaims{"org": map[string]any{"id": "acme"}})))
	if _, ok := v.claims(r); !ok {
		b.Fatal("refused")
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := v.claims(r); !ok {
			b.Fatal("refused")
		}
	}
}

func BenchmarkJWTFirstSight(b *testing.B) {
	k := keys(b)
	cases := []struct {
		name   string
		pem    []byte
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", nil, jwt.SigningMethodHS256, k.hmac},
		{"RS256", k.rsaPEM, jwt.SigningMethodRS256, k.rsa},
		{"ES256", k.ec256PE, jwt.SigningMethodES256, k.ec256},
		{"EdDSA", k.edPEM, jwt.SigningMethodEdDSA, k.ed},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			cfg := &JWTConfig{Secret: string(k.hmac)}
			if tc.pem != nil {
				cfg = pemConfig(b, tc.pem)
			}
			v := benchVerifier(b, cfg)
			const pool = 512
			reqs := make([]*http.Request, pool)
			now := time.Now()
			for i := range reqs {
				reqs[i] = bearer(sign(b, tc.method, tc.key, "", claimsAt(now, jwt.MapClaims{"jti": i, "org": map[string]any{"id": "acme"}})))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%pool == 0 && i > 0 {
					b.StopTimer()
					v.good, v.bad = newJWTCache(jwtCacheSize), newJWTCache(jwtFailureCacheSize)
					b.StartTimer()
				}
				if _, ok := v.claims(reqs[i%pool]); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// pemConfig writes pemData to a temporary file and configures it as the
// public key.
func pemConfig(tb testing.TB, pemData []byte) *JWTConfig {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "key.pem")
	if err := os.WriteFile(path, pemData, 0o600); err != nil {
		tb.Fatal(err)
	}
	return &JWTConfig{PublicKey: path}
}

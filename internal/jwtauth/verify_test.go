package jwtauth

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// newVerifier builds a verifier from o, closed when tb ends.
func newVerifier(tb testing.TB, o Options) *Verifier {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	v, err := New(ctx, o)
	if err != nil {
		cancel()
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		v.Close()
		cancel()
	})
	return v
}

// pemFile writes pemData to a temporary file, for Options.PublicKeyFile.
func pemFile(tb testing.TB, pemData []byte) string {
	tb.Helper()
	return jwttest.WriteFile(tb, "key.pem", pemData)
}
func TestJWTVerifiesEachKeyType(t *testing.T) {
	k := jwttest.TestKeys(t)
	cases := []struct {
		name   string
		cfg    func(t *testing.T) Options
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", func(*testing.T) Options { return Options{Secret: k.HMAC} }, jwt.SigningMethodHS256, k.HMAC},
		{"HS512", func(*testing.T) Options { return Options{Secret: k.HMAC} }, jwt.SigningMethodHS512, k.HMAC},
		{"RS256", func(t *testing.T) Options { return Options{PublicKeyFile: pemFile(t, k.RSAPEM)} }, jwt.SigningMethodRS256, k.RSA},
		{"PS384", func(t *testing.T) Options { return Options{PublicKeyFile: pemFile(t, k.RSAPEM)} }, jwt.SigningMethodPS384, k.RSA},
		{"ES256", func(t *testing.T) Options { return Options{PublicKeyFile: pemFile(t, k.EC256PEM)} }, jwt.SigningMethodES256, k.EC256},
		{"ES384", func(t *testing.T) Options { return Options{PublicKeyFile: pemFile(t, k.EC384PEM)} }, jwt.SigningMethodES384, k.EC384},
		{"EdDSA", func(t *testing.T) Options { return Options{PublicKeyFile: pemFile(t, k.EdPEM)} }, jwt.SigningMethodEdDSA, k.Ed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock(jwttest.Epoch)
			cfg := tc.cfg(t)
			cfg.Issuer, cfg.Audience, cfg.Clock = "https://issuer.test", "floodgate", clock
			v := newVerifier(t, cfg)
			tok := jwttest.Sign(t, tc.method, tc.key, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"org": map[string]any{"id": 42}}))
			c, ok := v.Claims(jwttest.Bearer(tok))
			if !ok {
				t.Fatalf("valid %s token refused", tc.name)
			}
			if got, _ := c.Lookup("sub"); got != "user-1" {
				t.Errorf("sub = %q", got)
			}
			if got, _ := c.Lookup("org.id"); got != "42" {
				t.Errorf("org.id = %q", got)
			}
		})
	}
}

func TestJWTRejects(t *testing.T) {
	k := jwttest.TestKeys(t)
	clock := testutil.NewClock(jwttest.Epoch)
	rsaCfg := func() Options {
		return Options{PublicKeyFile: pemFile(t, k.RSAPEM), Issuer: "https://issuer.test", Audience: "floodgate", Clock: clock}
	}
	hmacCfg := Options{Secret: k.HMAC, Issuer: "https://issuer.test", Audience: "floodgate", Clock: clock}
	ecCfg := Options{PublicKeyFile: pemFile(t, k.EC256PEM), Clock: clock}
	edCfg := Options{PublicKeyFile: pemFile(t, k.EdPEM), Clock: clock}
	rsaV, hmacV, ecV, edV := newVerifier(t, rsaCfg()), newVerifier(t, hmacCfg), newVerifier(t, ecCfg), newVerifier(t, edCfg)

	good := jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, nil))
	otherRSA, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwttest.ClaimsAt(jwttest.Epoch, nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	// Same header and claims, signature of another token: a forgery.
	other := strings.Split(jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"sub": "admin"})), ".")
	forged := other[0] + "." + other[1] + "." + parts[2]

	cases := []struct {
		name  string
		v     *Verifier
		token string
	}{
		{"forged signature", rsaV, forged},
		{"signed by another key", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, otherRSA, "", jwttest.ClaimsAt(jwttest.Epoch, nil))},
		{"alg none (RSA config)", rsaV, none},
		{"alg none (HMAC config)", hmacV, none},
		{"alg none with the good signature", rsaV, none + parts[2]},
		{"expired beyond leeway", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"exp": jwttest.Epoch.Add(-31 * time.Second).Unix()}))},
		{"not yet valid beyond leeway", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"nbf": jwttest.Epoch.Add(31 * time.Second).Unix()}))},
		{"wrong issuer", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"iss": "https://evil.test"}))},
		{"missing issuer", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"iss": nil}))},
		{"wrong audience", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"aud": []string{"a", "b"}}))},
		{"missing audience", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"aud": nil}))},
		{"exp of the wrong type", rsaV, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"exp": "tomorrow"}))},
		{"HMAC keyed with the RSA public key (alg confusion)", rsaV, jwttest.Sign(t, jwt.SigningMethodHS256, k.RSAPEM, "", jwttest.ClaimsAt(jwttest.Epoch, nil))},
		{"HMAC keyed with the EC public key (alg confusion)", ecV, jwttest.Sign(t, jwt.SigningMethodHS256, k.EC256PEM, "", jwttest.ClaimsAt(jwttest.Epoch, nil))},
		{"RS256 token to an HMAC config", hmacV, good},
		{"ES384 token to a P-256 key", ecV, jwttest.Sign(t, jwt.SigningMethodES384, k.EC384, "", jwttest.ClaimsAt(jwttest.Epoch, nil))},
		{"ES512 token to an Ed25519 key", edV, jwttest.Sign(t, jwt.SigningMethodES512, k.EC521, "", jwttest.ClaimsAt(jwttest.Epoch, nil))},
		{"truncated", rsaV, good[:len(good)-10]},
		{"two segments", rsaV, parts[0] + "." + parts[1]},
		{"four segments", rsaV, good + ".x"},
		{"garbage", rsaV, "not a token"},
		{"padded base64", rsaV, parts[0] + "=." + parts[1] + "." + parts[2]},
		{"too long", hmacV, jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"pad": strings.Repeat("x", maxTokenLen)}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 2 { // the second answer comes from the failure cache
				if c, ok := tc.v.Claims(jwttest.Bearer(tc.token)); ok || c != nil {
					t.Fatalf("attempt %d: accepted: %v", i, c)
				}
			}
		})
	}
	if _, ok := rsaV.Claims(jwttest.Bearer(good)); !ok {
		t.Fatal("the good token is refused")
	}
	// Within the leeway on both sides.
	for _, extra := range []jwt.MapClaims{
		{"exp": jwttest.Epoch.Add(-29 * time.Second).Unix()},
		{"nbf": jwttest.Epoch.Add(29 * time.Second).Unix()},
	} {
		if _, ok := rsaV.Claims(jwttest.Bearer(jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(jwttest.Epoch, extra)))); !ok {
			t.Errorf("token %v within the leeway refused", extra)
		}
	}
	if n := rsaV.panics.Load() + hmacV.panics.Load() + ecV.panics.Load() + edV.panics.Load(); n != 0 {
		t.Errorf("%d panics recovered", n)
	}
}

func TestJWTAllowUnverified(t *testing.T) {
	clock := testutil.NewClock(jwttest.Epoch)
	v := newVerifier(t, Options{AllowUnverified: true, Issuer: "https://issuer.test", Clock: clock})
	anyKey := []byte("a key nobody configured anywhere")
	if c, ok := v.Claims(jwttest.Bearer(jwttest.Sign(t, jwt.SigningMethodHS256, anyKey, "", jwttest.ClaimsAt(jwttest.Epoch, nil)))); !ok || c["sub"] != "user-1" {
		t.Fatalf("unverified token refused: %v %v", c, ok)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwttest.ClaimsAt(jwttest.Epoch, nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"alg none":     none,
		"expired":      jwttest.Sign(t, jwt.SigningMethodHS256, anyKey, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"exp": jwttest.Epoch.Add(-time.Hour).Unix()})),
		"not yet":      jwttest.Sign(t, jwt.SigningMethodHS256, anyKey, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"nbf": jwttest.Epoch.Add(time.Hour).Unix()})),
		"wrong issuer": jwttest.Sign(t, jwt.SigningMethodHS256, anyKey, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"iss": "x"})),
		"unknown alg":  "eyJhbGciOiJYWTEyIn0.eyJzdWIiOiJ4In0.c2ln",
		"garbage":      "a.b.c",
	} {
		if _, ok := v.Claims(jwttest.Bearer(tok)); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestJWTCacheAvoidsReverification(t *testing.T) {
	k := jwttest.TestKeys(t)
	clock := testutil.NewClock(jwttest.Epoch)
	v := newVerifier(t, Options{Secret: k.HMAC, Leeway: 10 * time.Second, Clock: clock})
	tok := jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"exp": jwttest.Epoch.Add(2 * time.Minute).Unix()}))
	for range 5 {
		if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
			t.Fatal("refused")
		}
	}
	if n := v.Verifications(); n != 1 {
		t.Fatalf("verified %d times, want 1", n)
	}
	// Still valid just before exp+leeway, from the cache.
	clock.Advance(2*time.Minute + 9*time.Second)
	if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
		t.Fatal("refused within leeway")
	}
	if n := v.Verifications(); n != 1 {
		t.Fatalf("verified %d times, want 1", n)
	}
	// Past exp+leeway the cached entry is dead and verification fails.
	clock.Advance(2 * time.Second)
	if _, ok := v.Claims(jwttest.Bearer(tok)); ok {
		t.Fatal("expired token served from the cache")
	}

	// Failures are cached briefly and never yield claims.
	bad := tok[:len(tok)-2] + "AA"
	before := v.Verifications()
	for range 5 {
		if c, ok := v.Claims(jwttest.Bearer(bad)); ok || c != nil {
			t.Fatal("bad token accepted")
		}
	}
	if n := v.Verifications() - before; n != 1 {
		t.Fatalf("bad token verified %d times, want 1", n)
	}
	clock.Advance(failureTTL)
	v.Claims(jwttest.Bearer(bad))
	if n := v.Verifications() - before; n != 2 {
		t.Fatalf("bad token verified %d times after the failure TTL, want 2", n)
	}

	// A token without exp is cached no longer than the static cap.
	noExp := jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(clock.Now(), jwt.MapClaims{"exp": nil}))
	v.Claims(jwttest.Bearer(noExp))
	before = v.Verifications()
	clock.Advance(staticCacheTTL - time.Second)
	v.Claims(jwttest.Bearer(noExp))
	clock.Advance(2 * time.Second)
	if _, ok := v.Claims(jwttest.Bearer(noExp)); !ok {
		t.Fatal("token without exp refused")
	}
	if n := v.Verifications() - before; n != 1 {
		t.Fatalf("re-verifications after the cache cap = %d, want 1", n)
	}
}

func TestJWTVerifierCacheBounded(t *testing.T) {
	k := jwttest.TestKeys(t)
	v := newVerifier(t, Options{Secret: k.HMAC})
	now := time.Now()
	for i := range cacheSize + 2000 {
		tok := jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(now, jwt.MapClaims{"jti": i}))
		if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
			t.Fatal("refused")
		}
		v.Claims(jwttest.Bearer(tok + "x")) // a failure each time
	}
	limit := (cacheSize/cacheShards + 1) * cacheShards
	if n := v.good.len(); n > limit {
		t.Errorf("verified cache holds %d, bound %d", n, limit)
	}
	if n := v.bad.len(); n > failureCacheSize+cacheShards {
		t.Errorf("failure cache holds %d, bound %d", n, failureCacheSize)
	}
}

func TestJWTConcurrentClaims(t *testing.T) {
	k := jwttest.TestKeys(t)
	v := newVerifier(t, Options{Secret: k.HMAC})
	toks := make([]string, 20)
	for i := range toks {
		toks[i] = jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": fmt.Sprint(i)}))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				j := (i + g) % len(toks)
				c, ok := v.Claims(jwttest.Bearer(toks[j]))
				if sub, _ := c.Lookup("sub"); !ok || sub != fmt.Sprint(j) {
					t.Errorf("token %d: ok=%v sub=%q", j, ok, sub)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestNewErrors checks that New refuses keys it cannot use and options
// that say nothing or too much about how to verify, rather than building a
// verifier that refuses or accepts everything.
func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	privPath := filepath.Join(dir, "priv.pem")
	der, _ := x509.MarshalPKCS8PrivateKey(jwttest.TestKeys(t).EC256)
	if err := os.WriteFile(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"missing file":           {PublicKeyFile: filepath.Join(dir, "nope.pem")},
		"not PEM":                {PublicKeyFile: notPEM},
		"private key PEM":        {PublicKeyFile: privPath},
		"nothing to verify with": {},
		"secret and JWKS":        {Secret: []byte("s"), JWKSURL: "http://127.0.0.1:1/"},
		"unverified with a key":  {AllowUnverified: true, PublicKeyFile: notPEM},
		"secret, key and JWKS":   {Secret: []byte("s"), PublicKeyFile: notPEM, JWKSURL: "http://127.0.0.1:1/"},
	} {
		if v, err := New(context.Background(), o); err == nil {
			v.Close()
			t.Errorf("%s: no error", name)
		}
	}
}

package ratelimit

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, pub *rsa.PublicKey) map[string]any {
	return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
}

func ecJWK(tb testing.TB, kid string, pub *ecdsa.PublicKey) map[string]any {
	tb.Helper()
	point, err := pub.Bytes() // 0x04 || X || Y
	if err != nil {
		tb.Fatal(err)
	}
	size := (len(point) - 1) / 2
	return map[string]any{"kty": "EC", "kid": kid, "crv": pub.Curve.Params().Name, "x": b64(point[1 : 1+size]), "y": b64(point[1+size:])}
}

func okpJWK(kid string, pub ed25519.PublicKey) map[string]any {
	return map[string]any{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pub)}
}

func jwksDoc(tb testing.TB, keys ...map[string]any) []byte {
	tb.Helper()
	if keys == nil {
		keys = []map[string]any{}
	}
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// jwksServer serves a replaceable JWKS document on 127.0.0.1 and counts
// requests. fail answers the next n requests with 500.
type jwksServer struct {
	*httptest.Server
	body atomic.Pointer[[]byte]
	hits atomic.Int64
	fail atomic.Int64
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	s := &jwksServer{}
	s.set(body)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if s.fail.Add(-1) >= 0 {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*s.body.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(body []byte) { s.body.Store(&body) }

// eventually polls cond for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestJWKSVerifiesEachKeyType(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwksDoc(t,
		rsaJWK("r", &k.rsa.PublicKey),
		ecJWK(t, "e256", &k.ec256.PublicKey),
		ecJWK(t, "e384", &k.ec384.PublicKey),
		ecJWK(t, "e521", &k.ec521.PublicKey),
		okpJWK("ed", k.ed.Public().(ed25519.PublicKey)),
		map[string]any{"kty": "oct", "kid": "h", "k": b64(k.hmac)},
		map[string]any{"kty": "RSA", "kid": "enc", "use": "enc", "n": b64(k.rsa.N.Bytes()), "e": "AQAB"},
	))
	v := provisionJWT(t, &JWTConfig{JWKSURL: srv.URL, Audience: "floodgate"})
	now := time.Now()
	good := map[string]string{
		"RS256":        sign(t, jwt.SigningMethodRS256, k.rsa, "r", claimsAt(now, nil)),
		"PS512":        sign(t, jwt.SigningMethodPS512, k.rsa, "r", claimsAt(now, nil)),
		"ES256":        sign(t, jwt.SigningMethodES256, k.ec256, "e256", claimsAt(now, nil)),
		"ES384":        sign(t, jwt.SigningMethodES384, k.ec384, "e384", claimsAt(now, nil)),
		"ES512":        sign(t, jwt.SigningMethodES512, k.ec521, "e521", claimsAt(now, nil)),
		"EdDSA":        sign(t, jwt.SigningMethodEdDSA, k.ed, "ed", claimsAt(now, nil)),
		"EdDSA no kid": sign(t, jwt.SigningMethodEdDSA, k.ed, "", claimsAt(now, nil)),
		"ES256 no kid": sign(t, jwt.SigningMethodES256, k.ec256, "", claimsAt(now, nil)),
	}
	for name, tok := range good {
		if _, ok := v.claims(bearer(tok)); !ok {
			t.Errorf("%s: refused", name)
		}
	}
	bad := map[string]string{
		"ES256 under the RSA kid":     sign(t, jwt.SigningMethodES256, k.ec256, "r", claimsAt(now, nil)),
		"ES384 under the P-256 kid":   sign(t, jwt.SigningMethodES384, k.ec384, "e256", claimsAt(now, nil)),
		"HS256 keyed with the oct":    sign(t, jwt.SigningMethodHS256, k.hmac, "h", claimsAt(now, nil)),
		"HS256 keyed with RSA n":      sign(t, jwt.SigningMethodHS256, k.rsa.N.Bytes(), "r", claimsAt(now, nil)),
		"RS256 under the enc kid":     sign(t, jwt.SigningMethodRS256, k.rsa, "enc", claimsAt(now, nil)),
		"wrong audience":              sign(t, jwt.SigningMethodRS256, k.rsa, "r", claimsAt(now, jwt.MapClaims{"aud": "other"})),
		"kid that is not a string":    signWithHeader(t, jwt.SigningMethodRS256, k.rsa, map[string]any{"kid": 5}, claimsAt(now, nil)),
		"EdDSA signed by another key": sign(t, jwt.SigningMethodEdDSA, mustEd(t), "ed", claimsAt(now, nil)),
	}
	for name, tok := range bad {
		if _, ok := v.claims(bearer(tok)); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	set := v.jwks.current()
	if len(set.keys) != 5 {
		t.Errorf("usable keys = %d, want 5", len(set.keys))
	}
}

func mustEd(t *testing.T) ed25519.PrivateKey {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

func signWithHeader(t *testing.T, m jwt.SigningMethod, key any, header map[string]any, claims jwt.MapClaims) string {
	tok := jwt.NewWithClaims(m, claims)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWKSRotation(t *testing.T) {
	k := keys(t)
	keyB, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	srv := newJWKSServer(t, jwksDoc(t, rsaJWK("a", &k.rsa.PublicKey)))
	v := provisionJWT(t, &JWTConfig{JWKSURL: srv.URL})
	now := time.Now()
	tokA := sign(t, jwt.SigningMethodRS256, k.rsa, "a", claimsAt(now, nil))
	tokB := sign(t, jwt.SigningMethodRS256, keyB, "b", claimsAt(now, nil))
	if _, ok := v.claims(bearer(tokA)); !ok {
		t.Fatal("token of the first key refused")
	}
	if got := srv.hits.Load(); got != 1 {
		t.Fatalf("fetches after provision = %d, want 1", got)
	}

	// The provider rotates: only kid b remains.
	srv.set(jwksDoc(t, rsaJWK("b", &keyB.PublicKey)))
	start := time.Now()
	if _, ok := v.claims(bearer(tokB)); ok {
		t.Fatal("the request that misses the kid must fail")
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("the missing request waited %s; the refetch must not block it", d)
	}
	eventually(t, "the refetch", func() bool { return len(v.jwks.current().byKid["b"]) == 1 })
	if _, ok := v.claims(bearer(tokB)); !ok {
		t.Fatal("token of the new key refused after the refetch")
	}
	// The old key is gone, and so is its cached verification.
	if _, ok := v.claims(bearer(tokA)); ok {
		t.Fatal("token of the removed key still accepted")
	}

	// More unknown kids within the minute trigger no further fetch.
	fetches := srv.hits.Load()
	for i := range 20 {
		tok := sign(t, jwt.SigningMethodRS256, keyB, "unknown-"+string(rune('a'+i)), claimsAt(now, nil))
		if _, ok := v.claims(bearer(tok)); ok {
			t.Fatal("unknown kid accepted")
		}
	}
	time.Sleep(50 * time.Millisecond)
	if got := srv.hits.Load(); got != fetches {
		t.Fatalf("unknown kids caused %d more fetches within a minute, want 0", got-fetches)
	}
}

func TestJWKSRefetchRateLimitAllowsLaterMiss(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwksDoc(t, rsaJWK("a", &k.rsa.PublicKey)))
	clock := newTestClock(time.Now())
	v := provisionJWT(t, &JWTConfig{JWKSURL: srv.URL, now: clock.now})
	tokWithJTI := func(jti int) string {
		return sign(t, jwt.SigningMethodRS256, k.rsa, "x", claimsAt(clock.now(), jwt.MapClaims{"jti": jti}))
	}
	v.claims(bearer(tokWithJTI(1)))
	eventually(t, "the first refetch", func() bool { return v.jwks.fetches.Load() == 2 })
	clock.advance(30 * time.Second)
	v.claims(bearer(tokWithJTI(2))) // another token, same missing kid: too soon
	time.Sleep(30 * time.Millisecond)
	if got := v.jwks.fetches.Load(); got != 2 {
		t.Fatalf("fetches = %d within the minute, want 2", got)
	}
	clock.advance(31 * time.Second)
	v.claims(bearer(tokWithJTI(3)))
	eventually(t, "a refetch a minute later", func() bool { return v.jwks.fetches.Load() == 3 })
}

func TestJWKSBackgroundRefreshAndClose(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwksDoc(t, rsaJWK("a", &k.rsa.PublicKey)))
	cfg := &JWTConfig{JWKSURL: srv.URL, jwksRefreshOverride: 10 * time.Millisecond}
	v := provisionJWT(t, cfg)
	eventually(t, "background refreshes", func() bool { return srv.hits.Load() >= 4 })
	// An unchanged document keeps the generation, so cached tokens survive.
	if gen := v.jwks.current().gen; gen != 1 {
		t.Errorf("generation = %d after unchanged refreshes, want 1", gen)
	}
	v.close()
	select {
	case <-v.jwks.done:
	default:
		t.Fatal("refresh goroutine still running after close")
	}
	after := srv.hits.Load()
	time.Sleep(50 * time.Millisecond)
	if got := srv.hits.Load(); got != after {
		t.Fatalf("%d fetches after close", got-after)
	}
	v.close() // idempotent
}

func TestJWKSInitialFailureRecovers(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwksDoc(t, rsaJWK("a", &k.rsa.PublicKey)))
	srv.fail.Store(2)
	v := provisionJWT(t, &JWTConfig{JWKSURL: srv.URL, jwksRetryMin: 10 * time.Millisecond, jwksMissInterval: time.Hour})
	tok := sign(t, jwt.SigningMethodRS256, k.rsa, "a", claimsAt(time.Now(), nil))
	if len(v.jwks.current().keys) != 0 {
		t.Fatal("keys loaded although the first fetch failed")
	}
	eventually(t, "verification after the retries", func() bool {
		_, ok := v.claims(bearer(tok))
		return ok
	})
	if got := srv.hits.Load(); got != 3 {
		t.Errorf("fetches = %d, want 3 (two failures, one success)", got)
	}
}

func TestJWKSUnreachableAndSlow(t *testing.T) {
	// Nothing listens on this port once the server is closed.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	v := provisionJWT(t, &JWTConfig{JWKSURL: deadURL})
	if _, ok := v.claims(bearer("eyJhbGciOiJSUzI1NiIsImtpZCI6ImEifQ.e30.c2ln")); ok {
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
	v2 := provisionJWT(t, &JWTConfig{JWKSURL: slow.URL, httpClient: &http.Client{Timeout: 100 * time.Millisecond}})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("provision waited %s for a hanging JWKS", d)
	}
	start = time.Now()
	v2.close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("close waited %s", d)
	}
}

func TestJWKSFetchKeepsKeysOnFailure(t *testing.T) {
	k := keys(t)
	var body atomic.Value
	status := atomic.Int64{}
	status.Store(200)
	body.Store(jwksDoc(t, rsaJWK("a", &k.rsa.PublicKey)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write(body.Load().([]byte))
	}))
	t.Cleanup(srv.Close)
	src := &jwksSource{url: srv.URL, client: &http.Client{Timeout: time.Second}, logger: zap.NewNop(), now: time.Now, missInterval: time.Minute}
	src.set.Store(newJWTKeySet(nil, false, 0))
	ctx := context.Background()
	if err := src.fetch(ctx); err != nil {
		t.Fatal(err)
	}
	failures := map[string]func(){
		"status":    func() { status.Store(503) },
		"too large": func() { body.Store([]byte(`{"keys":[],"pad":"` + strings.Repeat("x", jwksMaxBody) + `"}`)) },
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

func TestParseJWKSKeys(t *testing.T) {
	k := keys(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ec := ecJWK(t, "e", &k.ec256.PublicKey)
	offCurve := map[string]any{"kty": "EC", "crv": "P-256", "x": ec["x"], "y": ec["x"]}
	shortX := map[string]any{"kty": "EC", "crv": "P-256", "x": b64([]byte{1, 2}), "y": ec["y"]}
	longX := map[string]any{"kty": "EC", "crv": "P-256", "x": b64(make([]byte, 33)), "y": ec["y"]}
	pinned := rsaJWK("p", &k.rsa.PublicKey)
	pinned["alg"] = "PS256"
	padded := rsaJWK("pad", &k.rsa.PublicKey)
	padded["n"] = base64.URLEncoding.EncodeToString(k.rsa.N.Bytes())
	cases := []struct {
		name string
		jwk  map[string]any
		ok   bool
		algs []string
	}{
		{"rsa", rsaJWK("r", &k.rsa.PublicKey), true, jwtRSAAlgs},
		{"rsa 1024", rsaJWK("s", &small.PublicKey), true, jwtRSAAlgs},
		{"rsa padded base64", padded, true, jwtRSAAlgs},
		{"rsa alg pinned", pinned, true, []string{"PS256"}},
		{"rsa alg of another type", map[string]any{"kty": "RSA", "n": b64(k.rsa.N.Bytes()), "e": "AQAB", "alg": "HS256"}, false, nil},
		{"rsa 512 bits", map[string]any{"kty": "RSA", "n": b64(make([]byte, 64)), "e": "AQAB"}, false, nil},
		{"rsa even exponent", map[string]any{"kty": "RSA", "n": b64(k.rsa.N.Bytes()), "e": b64([]byte{2})}, false, nil},
		{"rsa huge exponent", map[string]any{"kty": "RSA", "n": b64(k.rsa.N.Bytes()), "e": b64([]byte{1, 0, 0, 0, 0, 1})}, false, nil},
		{"rsa without n", map[string]any{"kty": "RSA", "e": "AQAB"}, false, nil},
		{"rsa bad base64", map[string]any{"kty": "RSA", "n": "!!", "e": "AQAB"}, false, nil},
		{"ec", ec, true, []string{"ES256"}},
		{"ec short x padded", shortX, false, nil}, // padded, then not on the curve
		{"ec long x", longX, false, nil},
		{"ec off curve", offCurve, false, nil},
		{"ec unknown curve", map[string]any{"kty": "EC", "crv": "secp256k1", "x": ec["x"], "y": ec["y"]}, false, nil},
		{"okp", okpJWK("o", k.ed.Public().(ed25519.PublicKey)), true, jwtEdDSAAlgs},
		{"okp short", map[string]any{"kty": "OKP", "crv": "Ed25519", "x": b64(make([]byte, 31))}, false, nil},
		{"okp x25519", map[string]any{"kty": "OKP", "crv": "X25519", "x": b64(make([]byte, 32))}, false, nil},
		{"oct", map[string]any{"kty": "oct", "k": "c2VjcmV0"}, false, nil},
		{"encryption key", map[string]any{"kty": "RSA", "use": "enc", "n": b64(k.rsa.N.Bytes()), "e": "AQAB"}, false, nil},
		{"members of the wrong type", map[string]any{"kty": "RSA", "n": 5, "e": true}, false, nil},
	}
	for _, tc := range cases {
		keys, skipped, err := parseJWKS(jwksDoc(t, tc.jwk))
		if tc.ok {
			if err != nil || len(keys) != 1 {
				t.Errorf("%s: err=%v skipped=%v", tc.name, err, skipped)
				continue
			}
			if strings.Join(keys[0].algs, ",") != strings.Join(tc.algs, ",") {
				t.Errorf("%s: algs %v, want %v", tc.name, keys[0].algs, tc.algs)
			}
		} else if err == nil || len(skipped) != 1 {
			t.Errorf("%s: accepted (err=%v, skipped=%v)", tc.name, err, skipped)
		}
	}
	// The number of keys kept is bounded.
	many := make([]map[string]any, jwksMaxKeys+10)
	for i := range many {
		many[i] = okpJWK("k", k.ed.Public().(ed25519.PublicKey))
	}
	got, _, err := parseJWKS(jwksDoc(t, many...))
	if err != nil || len(got) != jwksMaxKeys {
		t.Errorf("kept %d keys (err %v), want %d", len(got), err, jwksMaxKeys)
	}
	for _, doc := range []string{"", "null", "[]", `{"keys":{}}`, `{"keys":null}`} {
		if _, _, err := parseJWKS([]byte(doc)); err == nil {
			t.Errorf("parseJWKS(%q): no error", doc)
		}
	}
}

func TestJWTKeyAccepts(t *testing.T) {
	k := keys(t)
	rsaKey := &jwtKey{key: &k.rsa.PublicKey, algs: jwtRSAAlgs}
	ecKey := &jwtKey{key: &k.ec256.PublicKey, algs: []string{"ES256"}}
	// A key whose algs claim too much is still held to its type.
	lying := &jwtKey{key: &k.ec384.PublicKey, algs: []string{"ES256", "HS256", "RS256"}}
	hmacKey := &jwtKey{key: k.hmac, algs: jwtHMACAlgs}
	cases := []struct {
		key *jwtKey
		m   jwt.SigningMethod
		ok  bool
	}{
		{rsaKey, jwt.SigningMethodRS256, true},
		{rsaKey, jwt.SigningMethodPS256, true},
		{rsaKey, jwt.SigningMethodHS256, false},
		{rsaKey, jwt.SigningMethodES256, false},
		{rsaKey, jwt.SigningMethodNone, false},
		{ecKey, jwt.SigningMethodES256, true},
		{ecKey, jwt.SigningMethodES384, false},
		{lying, jwt.SigningMethodES256, false},
		{lying, jwt.SigningMethodHS256, false},
		{lying, jwt.SigningMethodRS256, false},
		{hmacKey, jwt.SigningMethodHS384, true},
		{hmacKey, jwt.SigningMethodRS256, false},
		{hmacKey, nil, false},
	}
	for i, tc := range cases {
		if got := tc.key.accepts(tc.m); got != tc.ok {
			t.Errorf("case %d: accepts = %v, want %v", i, got, tc.ok)
		}
	}
}

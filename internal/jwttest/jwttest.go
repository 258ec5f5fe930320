// Package jwttest holds what tests of JWT verification need on both sides
// of the package boundary: keys of every supported type, signed tokens,
// JWK documents and a JWKS server. The verifier's own tests (package
// jwtauth) and the handler's tests (the root package, through a real
// Caddy) sign the same kinds of tokens, and one copy of these helpers keeps
// them from drifting apart.
package jwttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Epoch is a fixed instant for tests that step a clock, far enough ahead
// that no real token is valid then by accident.
var Epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Keys holds one key of every kind a verifier supports, with the PEM form
// of each public key for configurations that read a file.
type Keys struct {
	RSA      *rsa.PrivateKey
	EC256    *ecdsa.PrivateKey
	EC384    *ecdsa.PrivateKey
	EC521    *ecdsa.PrivateKey
	Ed       ed25519.PrivateKey
	HMAC     []byte
	RSAPEM   []byte
	EC256PEM []byte
	EC384PEM []byte
	EdPEM    []byte
}

var (
	keysOnce sync.Once
	keys     *Keys
	keysErr  error
)

// TestKeys returns the keys, generated once per test binary because RSA
// generation is slow.
func TestKeys(tb testing.TB) *Keys {
	tb.Helper()
	keysOnce.Do(func() { keys, keysErr = generate() })
	if keysErr != nil {
		tb.Fatalf("generating test keys: %v", keysErr)
	}
	return keys
}

func generate() (*Keys, error) {
	k := &Keys{HMAC: []byte("0123456789abcdef0123456789abcdef")}
	var err error
	if k.RSA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	if k.EC256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	if k.EC384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		return nil, err
	}
	if k.EC521, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader); err != nil {
		return nil, err
	}
	if _, k.Ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		dst *[]byte
		pub crypto.PublicKey
	}{{&k.RSAPEM, k.RSA.Public()}, {&k.EC256PEM, k.EC256.Public()}, {&k.EC384PEM, k.EC384.Public()}, {&k.EdPEM, k.Ed.Public()}} {
		der, err := x509.MarshalPKIXPublicKey(p.pub)
		if err != nil {
			return nil, err
		}
		*p.dst = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	return k, nil
}

// WriteFile writes data to a file name in a temporary directory of tb and
// returns its path.
func WriteFile(tb testing.TB, name string, data []byte) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Sign makes a token; kid is set in the header when non-empty.
func Sign(tb testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	tb.Helper()
	header := map[string]any{}
	if kid != "" {
		header["kid"] = kid
	}
	return SignWithHeader(tb, m, key, header, claims)
}

// SignWithHeader makes a token with extra header members.
func SignWithHeader(tb testing.TB, m jwt.SigningMethod, key any, header map[string]any, claims jwt.MapClaims) string {
	tb.Helper()
	tok := jwt.NewWithClaims(m, claims)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	if err != nil {
		tb.Fatalf("signing %s: %v", m.Alg(), err)
	}
	return s
}

// ClaimsAt returns standard claims valid for an hour from at, with the
// issuer and audience the tests configure; extra adds claims, and a nil
// value in extra removes one.
func ClaimsAt(at time.Time, extra jwt.MapClaims) jwt.MapClaims {
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

// Bearer returns a request carrying token in the Authorization header
// (none when token is empty).
func Bearer(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

// B64 is base64url without padding, as JWK members are written.
func B64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// RSAJWK is pub as a JWK signature key.
func RSAJWK(kid string, pub *rsa.PublicKey) map[string]any {
	return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "n": B64(pub.N.Bytes()), "e": B64(big.NewInt(int64(pub.E)).Bytes())}
}

// ECJWK is pub as a JWK.
func ECJWK(tb testing.TB, kid string, pub *ecdsa.PublicKey) map[string]any {
	tb.Helper()
	point, err := pub.Bytes() // 0x04 || X || Y
	if err != nil {
		tb.Fatal(err)
	}
	size := (len(point) - 1) / 2
	return map[string]any{"kty": "EC", "kid": kid, "crv": pub.Curve.Params().Name, "x": B64(point[1 : 1+size]), "y": B64(point[1+size:])}
}

// OKPJWK is pub as a JWK.
func OKPJWK(kid string, pub ed25519.PublicKey) map[string]any {
	return map[string]any{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": B64(pub)}
}

// JWKSDoc is a JWK Set document holding keys.
func JWKSDoc(tb testing.TB, keys ...map[string]any) []byte {
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

// JWKSServer serves a replaceable JWKS document on 127.0.0.1 and counts
// requests. Fail answers the next n requests with 500.
type JWKSServer struct {
	*httptest.Server
	body atomic.Pointer[[]byte]
	Hits atomic.Int64
	Fail atomic.Int64
}

// NewJWKSServer starts a server serving body, closed when tb ends.
func NewJWKSServer(tb testing.TB, body []byte) *JWKSServer {
	s := &JWKSServer{}
	s.Set(body)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Hits.Add(1)
		if s.Fail.Add(-1) >= 0 {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*s.body.Load())
	}))
	tb.Cleanup(s.Close)
	return s
}

// Set replaces the document served.
func (s *JWKSServer) Set(body []byte) { s.body.Store(&body) }

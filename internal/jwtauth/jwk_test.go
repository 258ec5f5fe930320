package jwtauth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

func TestParseJWKSKeys(t *testing.T) {
	k := jwttest.TestKeys(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ec := jwttest.ECJWK(t, "e", &k.EC256.PublicKey)
	offCurve := map[string]any{"kty": "EC", "crv": "P-256", "x": ec["x"], "y": ec["x"]}
	shortX := map[string]any{"kty": "EC", "crv": "P-256", "x": jwttest.B64([]byte{1, 2}), "y": ec["y"]}
	longX := map[string]any{"kty": "EC", "crv": "P-256", "x": jwttest.B64(make([]byte, 33)), "y": ec["y"]}
	pinned := jwttest.RSAJWK("p", &k.RSA.PublicKey)
	pinned["alg"] = "PS256"
	padded := jwttest.RSAJWK("pad", &k.RSA.PublicKey)
	padded["n"] = base64.URLEncoding.EncodeToString(k.RSA.N.Bytes())
	cases := []struct {
		name string
		jwk  map[string]any
		ok   bool
		algs []string
	}{
		{"rsa", jwttest.RSAJWK("r", &k.RSA.PublicKey), true, rsaAlgs},
		{"rsa 1024", jwttest.RSAJWK("s", &small.PublicKey), true, rsaAlgs},
		{"rsa padded base64", padded, true, rsaAlgs},
		{"rsa alg pinned", pinned, true, []string{"PS256"}},
		{"rsa alg of another type", map[string]any{"kty": "RSA", "n": jwttest.B64(k.RSA.N.Bytes()), "e": "AQAB", "alg": "HS256"}, false, nil},
		{"rsa 512 bits", map[string]any{"kty": "RSA", "n": jwttest.B64(make([]byte, 64)), "e": "AQAB"}, false, nil},
		{"rsa even exponent", map[string]any{"kty": "RSA", "n": jwttest.B64(k.RSA.N.Bytes()), "e": jwttest.B64([]byte{2})}, false, nil},
		{"rsa huge exponent", map[string]any{"kty": "RSA", "n": jwttest.B64(k.RSA.N.Bytes()), "e": jwttest.B64([]byte{1, 0, 0, 0, 0, 1})}, false, nil},
		{"rsa without n", map[string]any{"kty": "RSA", "e": "AQAB"}, false, nil},
		{"rsa bad base64", map[string]any{"kty": "RSA", "n": "!!", "e": "AQAB"}, false, nil},
		{"ec", ec, true, []string{"ES256"}},
		{"ec short x padded", shortX, false, nil}, // padded, then not on the curve
		{"ec long x", longX, false, nil},
		{"ec off curve", offCurve, false, nil},
		{"ec unknown curve", map[string]any{"kty": "EC", "crv": "secp256k1", "x": ec["x"], "y": ec["y"]}, false, nil},
		{"okp", jwttest.OKPJWK("o", k.Ed.Public().(ed25519.PublicKey)), true, edDSAAlgs},
		{"okp short", map[string]any{"kty": "OKP", "crv": "Ed25519", "x": jwttest.B64(make([]byte, 31))}, false, nil},
		{"okp x25519", map[string]any{"kty": "OKP", "crv": "X25519", "x": jwttest.B64(make([]byte, 32))}, false, nil},
		{"oct", map[string]any{"kty": "oct", "k": "c2VjcmV0"}, false, nil},
		{"encryption key", map[string]any{"kty": "RSA", "use": "enc", "n": jwttest.B64(k.RSA.N.Bytes()), "e": "AQAB"}, false, nil},
		{"members of the wrong type", map[string]any{"kty": "RSA", "n": 5, "e": true}, false, nil},
	}
	for _, tc := range cases {
		keys, skipped, err := parseJWKS(jwttest.JWKSDoc(t, tc.jwk))
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
	many := make([]map[string]any, maxJWKSKeys+10)
	for i := range many {
		many[i] = jwttest.OKPJWK("k", k.Ed.Public().(ed25519.PublicKey))
	}
	got, _, err := parseJWKS(jwttest.JWKSDoc(t, many...))
	if err != nil || len(got) != maxJWKSKeys {
		t.Errorf("kept %d keys (err %v), want %d", len(got), err, maxJWKSKeys)
	}
	for _, doc := range []string{"", "null", "[]", `{"keys":{}}`, `{"keys":null}`} {
		if _, _, err := parseJWKS([]byte(doc)); err == nil {
			t.Errorf("parseJWKS(%q): no error", doc)
		}
	}
}

// TestParseJWKSLeniency checks the slips the parser forgave before go-jose
// read JWKs, and still does: an EC coordinate written without its leading
// zero byte, and private members published next to a public key.
func TestParseJWKSLeniency(t *testing.T) {
	k := jwttest.TestKeys(t)
	var short map[string]any
	for range 10000 {
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if point, _ := priv.PublicKey.Bytes(); point[1] == 0 {
			short = jwttest.ECJWK(t, "short", &priv.PublicKey)
			short["x"] = jwttest.B64(point[2:33])
			break
		}
	}
	if short == nil {
		t.Fatal("no P-256 key with a leading zero in x")
	}
	withPrivate := jwttest.RSAJWK("p", &k.RSA.PublicKey)
	withPrivate["d"] = "not even base64 !"
	withPrivate["p"] = 7
	for name, jwk := range map[string]map[string]any{"short EC coordinate": short, "private members": withPrivate} {
		if keys, skipped, err := parseJWKS(jwttest.JWKSDoc(t, jwk)); err != nil || len(keys) != 1 {
			t.Errorf("%s: refused: %v %v", name, err, skipped)
		}
	}
}

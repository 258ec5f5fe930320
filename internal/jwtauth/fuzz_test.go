package jwtauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"hash"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// hmacGenuine reports whether token carries a correct HMAC signature made
// with secret, checked independently of the verifier under test.
func hmacGenuine(token string, secret []byte) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return false
	}
	hdr, err := base64.RawURLEncoding.Strict().DecodeString(parts[0])
	if err != nil {
		return false
	}
	var h map[string]any // a map, as the parser uses: "alg" matched exactly
	if json.Unmarshal(hdr, &h) != nil {
		return false
	}
	alg, _ := h["alg"].(string)
	var newHash func() hash.Hash
	switch alg {
	case "HS256":
		newHash = sha256.New
	case "HS384":
		newHash = sha512.New384
	case "HS512":
		newHash = sha512.New
	default:
		return false
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(parts[2])
	if err != nil {
		return false
	}
	mac := hmac.New(newHash, secret)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	return hmac.Equal(mac.Sum(nil), sig)
}

func FuzzJWTClaims(f *testing.F) {
	k := jwttest.TestKeys(f)
	clock := testutil.NewClock(jwttest.Epoch)
	hmacV := newVerifier(f, Options{Secret: k.HMAC, Issuer: "https://issuer.test", Clock: clock})
	rsaV := newVerifier(f, Options{PublicKeyFile: pemFile(f, k.RSAPEM), Clock: clock})
	unverifiedV := newVerifier(f, Options{AllowUnverified: true, Clock: clock})
	cookieV := newVerifier(f, Options{Secret: k.HMAC, Place: Cookie, Name: "t", Clock: clock})
	queryV := newVerifier(f, Options{Secret: k.HMAC, Place: Query, Name: "t", Clock: clock})
	verifiers := []*Verifier{hmacV, rsaV, unverifiedV, cookieV, queryV}

	valid := jwttest.Sign(f, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"org": map[string]any{"id": 7}}))
	rsaTok := jwttest.Sign(f, jwt.SigningMethodRS256, k.RSA, "kid", jwttest.ClaimsAt(jwttest.Epoch, nil))
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwttest.ClaimsAt(jwttest.Epoch, nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for _, seed := range []string{
		valid,
		rsaTok,
		jwttest.Sign(f, jwt.SigningMethodHS512, k.HMAC, "", jwttest.ClaimsAt(jwttest.Epoch, jwt.MapClaims{"aud": []string{"a", "b"}, "n": 1e300})),
		jwttest.Sign(f, jwt.SigningMethodHS256, k.HMAC, "", jwt.MapClaims{"exp": "x", "nbf": []int{1}, "iss": 5}),
		jwttest.Sign(f, jwt.SigningMethodHS256, rsaPEMSecret(k), "", jwttest.ClaimsAt(jwttest.Epoch, nil)),
		none,
		valid[:len(valid)/2],
		valid[:len(valid)-1],
		valid + ".",
		valid + "=",
		"Bearer " + valid,
		"..",
		".",
		"",
		"a.b.c",
		"eyJhbGciOiJIUzI1NiJ9.bnVsbA.",
		"eyJhbGciOiJIUzI1NiJ9.W10.",
		"eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjFlOTk5OX0.",
		"eyJhbGciOiJFUzI1NiIsImtpZCI6W119.e30.AAAA",
		strings.Repeat("A", 1<<10) + "." + strings.Repeat("B", 1<<10) + ".C",
		"\x00\xff\xfe" + valid,
	} {
		f.Add(seed, uint16(0))
	}
	// Huge inputs are built from a short piece repeated, so the corpus
	// stays small (and cheap to mutate and minimize) while 1 MB headers are
	// still exercised.
	f.Add(".", uint16(1<<12))
	f.Add("x", uint16(maxTokenLen-1))
	f.Add("xxxxxxxxxxxxxxxx", uint16(1<<16-1)) // 1 MiB
	f.Add(valid, uint16(1<<12))                // about 1 MB of concatenated tokens
	f.Fuzz(func(t *testing.T, piece string, repeat uint16) {
		token := piece
		if n := len(piece) * (int(repeat) + 1); repeat > 0 && n <= 2<<20 {
			token = strings.Repeat(piece, int(repeat)+1)
		}
		for _, v := range verifiers {
			var r *http.Request
			switch v.place {
			case Cookie:
				r = httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
				r.Header.Set("Cookie", "t="+token)
			case Query:
				r = httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
				r.URL.RawQuery = "t=" + url.QueryEscape(token)
			default:
				r = jwttest.Bearer(token)
			}
			c, ok := v.Claims(r)
			if ok != (c != nil) {
				t.Fatalf("ok=%v with claims %v", ok, c)
			}
			// The cached answer agrees with the first one.
			c2, ok2 := v.Claims(r)
			if ok2 != ok {
				t.Fatalf("second answer ok=%v, first %v", ok2, ok)
			}
			if ok {
				if c2 == nil {
					t.Fatal("cached success without claims")
				}
				if v != unverifiedV && v != rsaV && !hmacGenuine(v.extract(r), k.HMAC) {
					t.Fatalf("accepted a token without a genuine signature: %q", v.extract(r))
				}
				if v == rsaV && !strings.HasPrefix(v.extract(r), strings.Split(rsaTok, ".")[0]) {
					// Only a mutation of the genuine RSA token could verify;
					// its header must not have changed.
					t.Fatalf("RSA config accepted a foreign token %q", v.extract(r))
				}
				for _, p := range []string{"sub", "org.id", "aud", token} {
					c.Lookup(p)
				}
			}
			// A raw header value (no Bearer scheme) must be ignored by
			// the Authorization source, and never panic.
			r2 := httptest.NewRequest(http.MethodGet, "http://example.test/", nil)
			r2.Header.Set("Authorization", token)
			if _, ok := hmacV.Claims(r2); ok && !strings.HasPrefix(strings.ToLower(token), "bearer ") {
				t.Fatal("token accepted without the Bearer scheme")
			}
		}
		if len(piece) < 4096 {
			want := ""
			if vals, _ := url.ParseQuery(piece); len(vals["t"]) > 0 {
				want = vals["t"][0]
			}
			if got := queryValue(piece, "t"); got != want {
				t.Fatalf("queryValue(%q) = %q, url.Values gives %q", piece, got, want)
			}
		}
		for _, v := range verifiers {
			if n := v.panics.Load(); n != 0 {
				t.Fatalf("%d panics recovered while verifying", n)
			}
		}
	})
}

// rsaPEMSecret returns the RSA public key PEM, used as an HMAC secret by an
// attacker trying algorithm confusion.
func rsaPEMSecret(k *jwttest.Keys) []byte { return k.RSAPEM }

var plainDecimal = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$`)

func FuzzLookupClaim(f *testing.F) {
	for _, s := range []struct{ doc, path string }{
		{`{"sub":"alice"}`, "sub"},
		{`{"org":{"id":42}}`, "org.id"},
		{`{"org":{"id":{"x":[1,2]}}}`, "org.id.x"},
		{`{"a.b":{"c":true}}`, "a.b.c"},
		{`{"n":1.50e+3}`, "n"},
		{`{"n":-0.0}`, "n"},
		{`{"n":12345678901234567890123}`, "n"},
		{`{"n":1e400}`, "n"},
		{`{"n":1e-400}`, "n"},
		{`{"n":1e99999999999}`, "n"},
		{`{"n":null}`, "n"},
		{`{"":{"":"x"}}`, "."},
		{`{"a":{"b":"c"}}`, "a..b"},
		{`[]`, "0"},
		{`{"n":` + strings.Repeat("9", 500) + `}`, "n"},
		{`{"n":0.` + strings.Repeat("0", 500) + `1}`, "n"},
	} {
		f.Add([]byte(s.doc), s.path)
	}
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		// renderDecimal on arbitrary text: plain decimal, exact.
		if out, ok := renderDecimal(path); ok {
			checkDecimal(t, path, out)
		}
		var claims map[string]any
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		if dec.Decode(&claims) != nil {
			return
		}
		out, ok := Claims(claims).Lookup(path)
		// Resolve the path independently to know what was found.
		val, found := claims[path]
		if path == "" {
			// An empty path names no claim, even one keyed "" (Lookup).
			val, found = nil, false
		}
		if !found && path != "" {
			var cur any = claims
			found = true
			for _, seg := range strings.Split(path, ".") {
				m, isMap := cur.(map[string]any)
				if seg == "" || !isMap {
					found = false
					break
				}
				if cur, found = m[seg]; !found {
					break
				}
			}
			val = cur
		}
		switch x := val.(type) {
		case string:
			if found && (!ok || out != x) {
				t.Fatalf("string claim %q rendered %q, %v", x, out, ok)
			}
		case bool:
			if !ok || (out != "true" && out != "false") {
				t.Fatalf("bool rendered %q, %v", out, ok)
			}
		case json.Number:
			if ok {
				checkDecimal(t, string(x), out)
			}
		default:
			if ok {
				t.Fatalf("%T claim gave %q", val, out)
			}
		}
	})
}

// checkDecimal asserts out is in plain decimal form and equals in exactly.
func checkDecimal(t *testing.T, in, out string) {
	t.Helper()
	if !plainDecimal.MatchString(out) || out == "-0" {
		t.Fatalf("renderDecimal(%q) = %q: not plain decimal", in, out)
	}
	if len(in) > 4096 {
		return
	}
	want, ok1 := new(big.Rat).SetString(in)
	if !ok1 {
		// big.Rat refuses exponents it cannot hold ("0E10000000000000000000"
		// is 0, which renderDecimal says): no oracle for this input.
		return
	}
	got, ok2 := new(big.Rat).SetString(out)
	if !ok2 || want.Cmp(got) != 0 {
		t.Fatalf("renderDecimal(%q) = %q: value changed", in, out)
	}
}

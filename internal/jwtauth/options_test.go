package jwtauth

import (
	"strings"
	"testing"
	"time"
)

// TestOptionsValidate: the one check of a verifier's options, which New
// and the adapter's jwt block both run, refuses what would verify nothing
// or be ambiguous, naming the field as the jwt block spells it.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" when accepted
	}{
		{"secret", Options{Secret: []byte("s")}, ""},
		{"public key", Options{PublicKeyFile: "k.pem"}, ""},
		{"jwks", Options{JWKSURL: "https://idp.test/jwks.json", JWKSRefresh: time.Hour}, ""},
		{"unverified", Options{AllowUnverified: true, Issuer: "i"}, ""},
		{"cookie", Options{Secret: []byte("s"), Place: Cookie, Name: "session"}, ""},
		{"nothing", Options{}, "one of secret, public_key or jwks_url"},
		{"two keys", Options{Secret: []byte("s"), PublicKeyFile: "k.pem"}, "only one of"},
		{"three keys", Options{Secret: []byte("s"), PublicKeyFile: "k.pem", JWKSURL: "https://idp.test/"}, "only one of"},
		{"unverified with a key", Options{AllowUnverified: true, Secret: []byte("s")}, "allow_unverified"},
		{"negative leeway", Options{Secret: []byte("s"), Leeway: -1}, "leeway"},
		{"negative refresh", Options{JWKSURL: "https://idp.test/", JWKSRefresh: -1}, "jwks_refresh"},
		{"refresh without jwks", Options{Secret: []byte("s"), JWKSRefresh: time.Hour}, "jwks_refresh needs jwks_url"},
		{"relative jwks url", Options{JWKSURL: "/jwks.json"}, "jwks_url"},
		{"ftp jwks url", Options{JWKSURL: "ftp://idp.test/jwks.json"}, "jwks_url"},
		{"bad jwks url", Options{JWKSURL: "http://[::1"}, "jwks_url"},
		// Over plain http anyone on the path could swap the keys: only a
		// loopback host is taken, and the error never shows a password.
		{"plain http jwks url", Options{JWKSURL: "http://idp.test/jwks.json"}, "plain http"},
		{"plain http jwks url with userinfo", Options{JWKSURL: "http://u:hunter2@idp.test/jwks.json"}, "u:xxxxx@idp.test"},
		{"plain http on localhost", Options{JWKSURL: "http://localhost:9000/jwks.json"}, ""},
		{"plain http on 127.0.0.1", Options{JWKSURL: "http://127.0.0.1:9000/jwks.json"}, ""},
		{"plain http on ::1", Options{JWKSURL: "http://[::1]:9000/jwks.json"}, ""},
	} {
		err := tc.o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

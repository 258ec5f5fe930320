package ratelimit

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

// Tests of the jwt block: its Caddyfile syntax, its validation, and the
// verifier it builds. The verifier itself is tested in internal/jwtauth.

func TestJWTProvisionErrors(t *testing.T) {
	t.Setenv("FLOODGATE_TEST_JWT_SECRET", "from-the-environment-0123456789abcdef")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	v, err := (&JWTConfig{Secret: "{env.FLOODGATE_TEST_JWT_SECRET}"}).newVerifier(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	tok := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("from-the-environment-0123456789abcdef"), "", jwttest.ClaimsAt(time.Now(), nil))
	if _, ok := v.Claims(jwttest.Bearer(tok)); !ok {
		t.Fatal("secret from the environment not used")
	}
	// Key files that cannot be used are tested in internal/jwtauth; one
	// shows their errors reach the handler.
	for name, cfg := range map[string]*JWTConfig{
		"unset env var":  {Secret: "{env.FLOODGATE_TEST_UNSET_VARIABLE}"},
		"missing file":   {PublicKey: filepath.Join(t.TempDir(), "nope.pem")},
		"invalid config": {},
	} {
		if v, err := cfg.newVerifier(ctx, nil); err == nil {
			v.Close()
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
		if err := tc.cfg.validate(); (err == nil) != tc.ok {
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

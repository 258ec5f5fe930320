package jwtauth

import (
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

func TestJWTKeyAccepts(t *testing.T) {
	k := jwttest.TestKeys(t)
	rsaKey := &key{pub: &k.RSA.PublicKey, algs: rsaAlgs}
	ecKey := &key{pub: &k.EC256.PublicKey, algs: []string{"ES256"}}
	// A key whose algs claim too much is still held to its type.
	lying := &key{pub: &k.EC384.PublicKey, algs: []string{"ES256", "HS256", "RS256"}}
	hmacKey := &key{pub: k.HMAC, algs: hmacAlgs}
	cases := []struct {
		key *key
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

package jwtauth

import (
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

// Benchmarks. BenchmarkNoToken is the baseline: a request without a token.
// BenchmarkJWTCached repeats one token; BenchmarkJWTFirstSight verifies
// tokens the cache has not seen (the cache is cleared, timer stopped, each
// time the pool of distinct tokens is used up).

func BenchmarkNoToken(b *testing.B) {
	v := newVerifier(b, Options{Secret: jwttest.TestKeys(b).HMAC})
	r := jwttest.Bearer("")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := v.Claims(r); ok {
			b.Fatal("claims without a token")
		}
	}
}

func BenchmarkJWTCached(b *testing.B) {
	k := jwttest.TestKeys(b)
	v := newVerifier(b, Options{PublicKeyFile: pemFile(b, k.RSAPEM)})
	r := jwttest.Bearer(jwttest.Sign(b, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"org": map[string]any{"id": "acme"}})))
	if _, ok := v.Claims(r); !ok {
		b.Fatal("refused")
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := v.Claims(r); !ok {
			b.Fatal("refused")
		}
	}
}

func BenchmarkJWTFirstSight(b *testing.B) {
	k := jwttest.TestKeys(b)
	cases := []struct {
		name   string
		pem    []byte
		method jwt.SigningMethod
		key    any
	}{
		{"HS256", nil, jwt.SigningMethodHS256, k.HMAC},
		{"RS256", k.RSAPEM, jwt.SigningMethodRS256, k.RSA},
		{"ES256", k.EC256PEM, jwt.SigningMethodES256, k.EC256},
		{"EdDSA", k.EdPEM, jwt.SigningMethodEdDSA, k.Ed},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			cfg := Options{Secret: k.HMAC}
			if tc.pem != nil {
				cfg = Options{PublicKeyFile: pemFile(b, tc.pem)}
			}
			v := newVerifier(b, cfg)
			const pool = 512
			reqs := make([]*http.Request, pool)
			now := time.Now()
			for i := range reqs {
				reqs[i] = jwttest.Bearer(jwttest.Sign(b, tc.method, tc.key, "", jwttest.ClaimsAt(now, jwt.MapClaims{"jti": i, "org": map[string]any{"id": "acme"}})))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%pool == 0 && i > 0 {
					b.StopTimer()
					v.good, v.bad = newCache(cacheSize), newCache(failureCacheSize)
					b.StartTimer()
				}
				if _, ok := v.Claims(reqs[i%pool]); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

// Handler benchmarks keyed by a JWT claim, to set beside
// BenchmarkHandlerIPKey: what verifying identities costs per request, once
// a token is cached and the first time it is seen.
//
// Each request gets a replacer of its own, as in Caddy: the handler maps
// {jwt.*} on the request's replacer, and reusing one replacer would answer
// every later lookup from the first request's memo without touching the
// verifier's cache. Requests are therefore built benchPrepared at a time
// with the timer stopped; only ServeHTTP is timed.

// benchJWTHandler provisions a handler with the jwt block jwtConf and one
// zone keyed by the verified sub, limited far above what a benchmark sends
// so every request is admitted. zone names the zone, so benchmarks never
// share state through the memory-store pool.
func benchJWTHandler(b *testing.B, zone, jwtConf string) *Handler {
	b.Helper()
	return provisionHandler(b, "rate_limit {\n jwt {\n  "+jwtConf+"\n }\n zone "+zone+" {\n  key jwt_claim sub\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n}")
}

// benchJWTBases builds the request each token is sent in.
func benchJWTBases(tokens []string) []*http.Request {
	bases := make([]*http.Request, len(tokens))
	for i, tok := range tokens {
		bases[i], _ = newKeyRequest("198.51.100.9", map[string]string{"Authorization": "Bearer " + tok})
	}
	return bases
}

// benchCheckVerified fails unless r's token verified through h, so a
// benchmark cannot pass while timing the missing-key path.
func benchCheckVerified(b *testing.B, h *Handler, r *http.Request) {
	b.Helper()
	if _, ok := h.jwt.Claims(r); !ok {
		b.Fatal("the benchmark token does not verify")
	}
}

// BenchmarkHandlerJWTCached is one allowed request keyed by `jwt_claim sub`
// with the same valid RS256 token every time: after the first request the
// verification is a cache hit, so this is the steady-state cost for a
// client reusing its token. Compare with BenchmarkHandlerIPKey.
func BenchmarkHandlerJWTCached(b *testing.B) {
	k := jwttest.TestKeys(b)
	h := benchJWTHandler(b, "bench_jwt_cached", "public_key "+jwttest.WriteFile(b, "rsa.pem", k.RSAPEM))
	token := jwttest.Sign(b, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": "bench-user"}))
	bases := benchJWTBases([]string{token})
	benchCheckVerified(b, h, bases[0])
	benchServeFresh(b, h, bases)
}

// BenchmarkHandlerJWTFirstSight is one allowed request whose token the
// handler has never seen: a full signature check per request, per
// algorithm. Signing is slower than verifying, so a pool of distinct tokens
// (distinct subjects too, so each is a new bucket) is signed before the
// timer and reused with a fresh verifier (so empty caches), built with the
// timer stopped, before each pass.
func BenchmarkHandlerJWTFirstSight(b *testing.B) {
	k := jwttest.TestKeys(b)
	for _, tc := range []struct {
		name    string
		jwtConf string
		method  jwt.SigningMethod
		key     any
	}{
		{"HS256", "secret " + string(k.HMAC), jwt.SigningMethodHS256, k.HMAC},
		{"RS256", "public_key " + jwttest.WriteFile(b, "rsa.pem", k.RSAPEM), jwt.SigningMethodRS256, k.RSA},
		{"ES256", "public_key " + jwttest.WriteFile(b, "ec256.pem", k.EC256PEM), jwt.SigningMethodES256, k.EC256},
		{"EdDSA", "public_key " + jwttest.WriteFile(b, "ed25519.pem", k.EdPEM), jwt.SigningMethodEdDSA, k.Ed},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := benchJWTHandler(b, "bench_jwt_first_"+tc.name, tc.jwtConf)
			now := time.Now()
			tokens := make([]string, benchPrepared)
			for i := range tokens {
				tokens[i] = jwttest.Sign(b, tc.method, tc.key, "", jwttest.ClaimsAt(now, jwt.MapClaims{"sub": fmt.Sprintf("user-%d", i), "jti": i}))
			}
			bases := benchJWTBases(tokens)
			reqs := make([]*http.Request, benchPrepared)
			benchRequests(reqs, bases)
			benchCheckVerified(b, h, reqs[0])
			w := httptest.NewRecorder()
			var verified int64 // by the verifiers replaced so far
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if i%benchPrepared == 0 {
					b.StopTimer()
					verified += h.jwt.Verifications()
					benchRenewVerifier(b, h)
					if i > 0 {
						benchRequests(reqs, bases)
					}
					b.StartTimer()
				}
				benchServe(b, h, w, reqs[i%benchPrepared], okHandler)
			}
			b.StopTimer()
			if misses := verified + h.jwt.Verifications(); misses < int64(b.N) {
				b.Fatalf("%d verifications for %d requests: some were cache hits", misses, b.N)
			}
		})
	}
}

// benchRenewVerifier gives h a verifier built afresh from its jwt block, so
// no token is in its caches, and closes the old one.
func benchRenewVerifier(b *testing.B, h *Handler) {
	b.Helper()
	v, err := h.JWT.newVerifier(context.Background(), nil)
	if err != nil {
		b.Fatal(err)
	}
	old := h.jwt
	h.jwt = v
	old.Close()
}

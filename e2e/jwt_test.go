package e2e

// End-to-end tests of limits keyed by verified JWT claims, through a real
// Caddy (internal/caddyproc): every key type (HS256 with the secret from
// {env.JWT_SECRET}, RS256, ES256 and EdDSA from PEM files, a rotating JWKS
// served on 127.0.0.1), nested claims, tiers from a claim, and the promise
// that a token failing verification in any way falls back to missing_key
// and never earns a bucket of its own. Quotas are per hour, so nothing
// refills during a test; the only wait is for the JWKS refetch, polled
// with a generous deadline.

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

// liveJWKSDeadline bounds the wait for a kid miss to refetch the JWKS: one
// request to a local server, but on a loaded machine.
const liveJWKSDeadline = 30 * time.Second

// liveJWT is the shared fixture: one Caddy with a route per verifier
// configuration, and what is needed to sign tokens for each.
type liveJWT struct {
	inst   *caddyproc.Instance
	k      *jwttest.Keys
	secret []byte
	// attacker is an RSA key Caddy does not know, for forged signatures.
	attacker *rsa.PrivateKey
	jwks     *jwttest.JWKSServer
}

// startLiveJWT writes the PEM files, starts the JWKS server and Caddy.
func startLiveJWT(t *testing.T) *liveJWT {
	t.Helper()
	f := &liveJWT{k: jwttest.TestKeys(t)}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		t.Fatal(err)
	}
	f.secret = []byte(hex.EncodeToString(raw[:]))
	var err error
	if f.attacker, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	rsaPath := jwttest.WriteFile(t, "rsa.pem", f.k.RSAPEM)
	ecPath := jwttest.WriteFile(t, "ec256.pem", f.k.EC256PEM)
	edPath := jwttest.WriteFile(t, "ed25519.pem", f.k.EdPEM)
	f.jwks = jwttest.NewJWKSServer(t, jwttest.JWKSDoc(t, jwttest.RSAJWK("k1", &f.k.RSA.PublicKey)))

	// route is one rate_limit with its own jwt block, which also requires
	// the issuer and audience claimsAt writes.
	route := func(path, jwtKey, zone string) string {
		return `
	handle ` + path + ` {
		rate_limit {
			jwt {
				` + jwtKey + `
				issuer https://issuer.test
				audience floodgate
			}
` + zone + `
		}
		respond "ok"
	}`
	}
	bySub := func(name string, events int, missing string) string {
		return fmt.Sprintf(`			zone %s {
				key jwt_claim sub
				rate %d/1h
				missing_key %s
			}`, name, events, missing)
	}
	config := globalsWith("") + `
http://{{http}} {` +
		route("/hs", "secret {env.JWT_SECRET}", bySub("jwt_hs", 3, "deny")) +
		route("/rs", "public_key "+rsaPath, bySub("jwt_rs", 3, "deny")) +
		route("/es", "public_key "+ecPath, bySub("jwt_es", 3, "deny")) +
		route("/ed", "public_key "+edPath, bySub("jwt_ed", 3, "deny")) +
		route("/org", "public_key "+rsaPath, `			zone jwt_org {
				key {jwt.org.id}
				rate 3/1h
				missing_key deny
			}`) +
		route("/tier", "secret {env.JWT_SECRET}", `			zone jwt_tier {
				key jwt_claim sub
				rate 2/1h
				tier {jwt.plan} {
					gold 4/1h
				}
				missing_key deny
			}`) +
		route("/bad-ip", "public_key "+rsaPath, bySub("bad_ip", 2, "ip")) +
		route("/bad-deny", "public_key "+rsaPath, bySub("bad_deny", 2, "deny")) +
		route("/bad-skip", "public_key "+rsaPath, bySub("bad_skip", 2, "skip")) +
		route("/jwks", "jwks_url "+f.jwks.URL+"/jwks", bySub("jwt_jwks", 100, "deny")) + `
	route /two {
		rate_limit {
			jwt {
				allow_unverified
			}
			zone two_outer {
				key jwt_claim sub
				rate 100/1h
			}
		}
		rate_limit {
			jwt {
				public_key ` + rsaPath + `
				issuer https://issuer.test
				audience floodgate
			}
			zone two_inner {
				key jwt_claim sub
				rate 1/1h
				missing_key deny
			}
		}
		respond "ok"
	}
}
`
	f.inst = caddyproc.Start(t, config, caddyproc.WithEnv("JWT_SECRET="+string(f.secret)))
	return f
}

// token signs claims valid now (iss, aud and exp as the routes require)
// for sub, with extra claims merged in (nil values delete).
func (f *liveJWT) token(t *testing.T, m jwt.SigningMethod, key any, kid, sub string, extra jwt.MapClaims) string {
	t.Helper()
	c := jwttest.ClaimsAt(time.Now(), extra)
	c["sub"] = sub
	// A fresh jti makes each token distinct, as re-issued tokens are.
	var id [8]byte
	_, _ = rand.Read(id[:])
	c["jti"] = hex.EncodeToString(id[:])
	return jwttest.Sign(t, m, key, kid, c)
}

// bearer is the Authorization header carrying token; none for "".
func bearer(token string) []string {
	if token == "" {
		return nil
	}
	return []string{"Authorization", "Bearer " + token}
}

// get sends GET path with the token as a bearer token.
func (f *liveJWT) get(t *testing.T, path, token string) response {
	t.Helper()
	return get(t, newClient(t), f.inst.URL(path), bearer(token)...)
}

// codes sends the token once per status in want, and marks the test
// failed unless the statuses are want.
func (f *liveJWT) codes(t *testing.T, what, path, token string, want ...int) []response {
	t.Helper()
	return expectCodes(t, what+" on "+path, newClient(t), f.inst.URL(path), want, bearer(token)...)
}

// TestLiveJWT is one Caddy for every JWT scenario; the subtests use routes
// and zones of their own, so they run in parallel against it.
func TestLiveJWT(t *testing.T) {
	t.Parallel()
	f := startLiveJWT(t)
	k := f.k

	t.Run("key types", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			path, zone string
			method     jwt.SigningMethod
			key        any
		}{
			{"/hs", "jwt_hs", jwt.SigningMethodHS256, f.secret},
			{"/rs", "jwt_rs", jwt.SigningMethodRS256, k.RSA},
			{"/es", "jwt_es", jwt.SigningMethodES256, k.EC256},
			{"/ed", "jwt_ed", jwt.SigningMethodEdDSA, k.Ed},
		} {
			t.Run(tc.method.Alg(), func(t *testing.T) {
				t.Parallel()
				alice1 := f.token(t, tc.method, tc.key, "", "alice", nil)
				alice2 := f.token(t, tc.method, tc.key, "", "alice", nil)
				bob := f.token(t, tc.method, tc.key, "", "bob", nil)
				rs := f.codes(t, "alice, first token", tc.path, alice1, 200, 200)
				if q := policyQuota(t, rs[0], tc.zone); q != 3 {
					t.Errorf("RateLimit-Policy %q, want q=3", rs[0].header.Get("RateLimit-Policy"))
				}
				// Another token of the same subject draws on the same bucket.
				rs = f.codes(t, "alice, second token", tc.path, alice2, 200, 429)
				if got := rs[0].header.Get("X-RateLimit-Remaining"); got != "0" {
					t.Errorf("alice's third request: remaining %q, want 0", got)
				}
				f.codes(t, "alice, first token again", tc.path, alice1, 429)
				rs = f.codes(t, "bob", tc.path, bob, 200)
				if got := rs[0].header.Get("X-RateLimit-Remaining"); got != "2" {
					t.Errorf("bob's first request: remaining %q, want 2 (a bucket of his own)", got)
				}
				f.codes(t, "no token", tc.path, "", 429)
				// Signed with a key the route does not trust, claiming bob:
				// missing_key deny, and bob's bucket untouched below.
				var forged string
				if tc.method == jwt.SigningMethodHS256 {
					forged = f.token(t, tc.method, []byte("not-the-secret-not-the-secret-00"), "", "bob", nil)
				} else {
					forged = f.token(t, jwt.SigningMethodRS256, f.attacker, "", "bob", nil)
				}
				f.codes(t, "forged bob", tc.path, forged, 429)
				f.codes(t, "bob after the forgery", tc.path, bob, 200, 200, 429)
			})
		}
	})

	t.Run("nested claim", func(t *testing.T) {
		t.Parallel()
		acme := jwt.MapClaims{"org": map[string]any{"id": "acme", "name": "Acme"}}
		alice := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "alice", acme)
		bob := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "bob", acme)
		carol := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "carol", jwt.MapClaims{"org": map[string]any{"id": 42}})
		dave := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "dave", jwt.MapClaims{"org": "acme"})
		f.codes(t, "alice of acme", "/org", alice, 200, 200)
		f.codes(t, "bob of acme", "/org", bob, 200, 429)
		f.codes(t, "alice of acme again", "/org", alice, 429)
		f.codes(t, "carol of org 42", "/org", carol, 200, 200, 200, 429)
		// org is not an object: org.id is missing, so missing_key deny.
		f.codes(t, "dave without org.id", "/org", dave, 429)
	})

	t.Run("tier from claim", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			sub   string
			extra jwt.MapClaims
			quota int
		}{
			{"gold-1", jwt.MapClaims{"plan": "gold"}, 4},
			{"gold-2", jwt.MapClaims{"plan": "gold"}, 4}, // own bucket in the tier
			{"silver", jwt.MapClaims{"plan": "silver"}, 2},
			{"no-plan", nil, 2},
		} {
			tok := f.token(t, jwt.SigningMethodHS256, f.secret, "", tc.sub, tc.extra)
			want := make([]int, tc.quota+1)
			for i := range tc.quota {
				want[i] = 200
			}
			want[tc.quota] = 429
			rs := f.codes(t, tc.sub, "/tier", tok, want...)
			for i, r := range rs {
				if q := policyQuota(t, r, "jwt_tier"); q != int64(tc.quota) {
					t.Errorf("%s response %d: RateLimit-Policy %q, want q=%d", tc.sub, i, r.header.Get("RateLimit-Policy"), tc.quota)
				}
				if got := r.header.Get("X-RateLimit-Limit"); got != strconv.Itoa(tc.quota) {
					t.Errorf("%s response %d: X-RateLimit-Limit %q, want %d", tc.sub, i, got, tc.quota)
				}
			}
		}
	})

	t.Run("bad tokens", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"ip", "deny", "skip"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				f.checkBadTokens(t, mode)
			})
		}
	})

	t.Run("two handlers", func(t *testing.T) {
		t.Parallel()
		// An outer rate_limit reads claims unverified; the inner one
		// verifies with the RSA key. The inner zones must be keyed by
		// what the inner jwt block verified, not by the outer's view.
		for i, tok := range []string{
			f.token(t, jwt.SigningMethodRS256, f.attacker, "", "forged-1", nil),
			f.token(t, jwt.SigningMethodHS256, []byte("attacker-chosen-secret-0123456789"), "", "forged-2", nil),
			f.token(t, jwt.SigningMethodES256, k.EC256, "", "forged-3", nil),
		} {
			f.codes(t, fmt.Sprintf("token %d not verified by the inner jwt block", i), "/two", tok, 429)
		}
		alice := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "alice", nil)
		f.codes(t, "genuine alice", "/two", alice, 200, 429)
	})

	t.Run("jwks rotation", func(t *testing.T) {
		t.Parallel()
		f.checkJWKSRotation(t)
	})
}

// badTokens are tokens that must not verify on the RSA routes, each
// claiming sub; an RSA-configured route must treat every one as no token.
func (f *liveJWT) badTokens(t *testing.T, sub string) map[string]string {
	t.Helper()
	k := f.k
	genuine := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "someone-else", nil)
	parts := strings.Split(genuine, ".")
	payload, err := json.Marshal(jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": sub}))
	if err != nil {
		t.Fatal(err)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwttest.ClaimsAt(time.Now(), jwt.MapClaims{"sub": sub})).
		SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"forged signature":  f.token(t, jwt.SigningMethodRS256, f.attacker, "", sub, nil),
		"tampered payload":  parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2],
		"alg none":          none,
		"expired":           jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, "", jwttest.ClaimsAt(time.Now().Add(-3*time.Hour), jwt.MapClaims{"sub": sub})),
		"not yet valid":     f.token(t, jwt.SigningMethodRS256, k.RSA, "", sub, jwt.MapClaims{"nbf": time.Now().Add(time.Hour).Unix()}),
		"wrong issuer":      f.token(t, jwt.SigningMethodRS256, k.RSA, "", sub, jwt.MapClaims{"iss": "https://evil.test"}),
		"wrong audience":    f.token(t, jwt.SigningMethodRS256, k.RSA, "", sub, jwt.MapClaims{"aud": "someone-else"}),
		"HS256, PEM secret": f.token(t, jwt.SigningMethodHS256, k.RSAPEM, "", sub, nil),
		"HS256, JWT_SECRET": f.token(t, jwt.SigningMethodHS256, f.secret, "", sub, nil),
		"ES256, other key":  f.token(t, jwt.SigningMethodES256, k.EC256, "", sub, nil),
		"garbage":           "not.a.token",
	}
}

// checkBadTokens exhausts alice's bucket, then presents every bad token
// claiming alice and bob under missing_key mode: none may reach a bucket
// of its own, nor spend alice's or bob's.
func (f *liveJWT) checkBadTokens(t *testing.T, mode string) {
	path, zone := "/bad-"+mode, "bad_"+mode
	k := f.k
	alice := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "alice", nil)
	bob := f.token(t, jwt.SigningMethodRS256, k.RSA, "", "bob", nil)
	f.codes(t, "genuine alice", path, alice, 200, 200, 429)

	admitted := 0
	for _, sub := range []string{"alice", "bob"} {
		for kind, tok := range f.badTokens(t, sub) {
			r := f.get(t, path, tok)
			what := fmt.Sprintf("%s token claiming %s", kind, sub)
			switch mode {
			case "ip":
				// One bucket for all of them: the client IP's, in the
				// missing-key namespace, of the zone's quota.
				if r.code == 200 {
					admitted++
					if policyQuota(t, r, zone) != 2 {
						t.Errorf("%s: RateLimit-Policy %q", what, r.header.Get("RateLimit-Policy"))
					}
				} else if r.code != 429 {
					t.Errorf("%s: status %d", what, r.code)
				}
			case "deny":
				if r.code != 429 {
					t.Errorf("%s: status %d, want 429 (missing_key deny)", what, r.code)
				}
			case "skip":
				if r.code != 200 {
					t.Errorf("%s: status %d, want 200 (missing_key skip)", what, r.code)
				}
				if v := r.header.Get("RateLimit"); v != "" {
					t.Errorf("%s: RateLimit %q; a skipped request is not limited by, nor reported for, the zone", what, v)
				}
			}
		}
	}
	if mode == "ip" && admitted != 2 {
		t.Errorf("bad tokens admitted %d times under missing_key ip; want exactly the IP bucket's 2", admitted)
	}
	// Nothing reset alice's bucket, and nothing spent bob's.
	f.codes(t, "genuine alice after bad tokens", path, alice, 429)
	f.codes(t, "genuine bob after bad tokens claiming bob", path, bob, 200, 200, 429)
	if mode == "ip" {
		// A request with no token is in the same IP bucket the bad
		// tokens used up.
		f.codes(t, "no token", path, "", 429)
	}
}

// checkJWKSRotation replaces the served key set with one whose only key has
// a new kid. The first token naming the new kid misses, and that miss
// triggers the one refetch allowed per minute; once it lands, new tokens
// verify, tokens of the dropped key stop verifying, and further misses do
// not fetch again.
func (f *liveJWT) checkJWKSRotation(t *testing.T) {
	k := f.k
	old := f.token(t, jwt.SigningMethodRS256, k.RSA, "k1", "alice", nil)
	f.codes(t, "kid k1 before rotation", "/jwks", old, 200)
	fetches := f.jwks.Hits.Load()
	if fetches < 1 {
		t.Fatalf("the JWKS was never fetched, yet a token verified")
	}

	f.jwks.Set(jwttest.JWKSDoc(t, jwttest.ECJWK(t, "k2", &k.EC256.PublicKey)))
	fresh := f.token(t, jwt.SigningMethodES256, k.EC256, "k2", "bob", nil)
	deadline := time.Now().Add(liveJWKSDeadline)
	attempts := 0
	for {
		attempts++
		r := f.get(t, "/jwks", fresh)
		if r.code == 200 {
			break
		}
		if r.code != 429 {
			t.Fatalf("kid k2 while the refetch is pending: status %d, want 429 (missing_key deny)", r.code)
		}
		if time.Now().After(deadline) {
			t.Fatalf("kid k2 still refused after %v and %d attempts; JWKS fetched %d times", liveJWKSDeadline, attempts, f.jwks.Hits.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("kid k2 verified after %d attempt(s)", attempts)
	if got := f.jwks.Hits.Load(); got != fetches+1 {
		t.Errorf("JWKS fetched %d times after rotation, want exactly one refetch (%d)", got-fetches, fetches+1)
	}

	// The dropped key no longer verifies, even for a token accepted (and
	// cached) before the rotation.
	f.codes(t, "kid k1 after rotation", "/jwks", old, 429)
	// More unknown kids within the minute: refused, and no fetch.
	for _, kid := range []string{"k3", "k4", "k5"} {
		tok := f.token(t, jwt.SigningMethodRS256, f.attacker, kid, "mallory", nil)
		f.codes(t, "unknown kid "+kid, "/jwks", tok, 429)
	}
	if got := f.jwks.Hits.Load(); got != fetches+1 {
		t.Errorf("JWKS fetched %d times after rotation and more misses; a kid miss may refetch at most once a minute", got-fetches)
	}
	f.codes(t, "kid k2 again", "/jwks", fresh, 200)
}

package ratelimit

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// Defaults and bounds of token verification.
const (
	// jwtDefaultLeeway absorbs clock skew between the issuer and this server
	// when checking exp and nbf.
	jwtDefaultLeeway = 30 * time.Second
	// jwtMaxTokenLen bounds the token considered; real tokens are a few KiB,
	// and a larger one is treated as no token without being parsed.
	jwtMaxTokenLen = 16 << 10
	// jwtCacheSize and jwtFailureCacheSize bound the verified-token cache
	// and the cache of failed tokens.
	jwtCacheSize        = 10000
	jwtFailureCacheSize = 4096
	// jwtFailureTTL is how long a failed token is remembered, so a flood of
	// one bad token costs one verification per interval.
	jwtFailureTTL = 10 * time.Second
	// jwtStaticCacheTTL caps how long a token verified with a configured
	// secret or public key is cached (tokens without exp included). With a
	// JWKS the cap is the refresh interval instead.
	jwtStaticCacheTTL = 10 * time.Minute
)

// JWTConfig configures how the rate limiter reads claims from a JSON Web
// Token, so zones can be keyed by a verified identity (`key jwt_claim sub`,
// `{jwt.org.id}`) instead of an IP address. Exactly one of secret,
// public_key and jwks_url says how signatures are checked, unless
// allow_unverified is set. A token that is missing, malformed, badly signed,
// expired, not yet valid, or from the wrong issuer or audience yields no
// claims, so the request is treated as having no key.
type JWTConfig struct {
	// Where the token is read from. Default: the Authorization header with
	// the Bearer scheme.
	From *TokenSource `json:"from,omitempty"`

	// Shared secret for HMAC-signed tokens (HS256, HS384, HS512).
	// Placeholders known at startup, such as {env.JWT_SECRET}, are replaced
	// when the handler is provisioned, so the secret need not be written in
	// the config.
	Secret string `json:"secret,omitempty"`

	// Path to a PEM file holding the public key (PKIX "PUBLIC KEY",
	// "RSA PUBLIC KEY" or a "CERTIFICATE") that signs tokens. RSA keys
	// accept RS256/384/512 and PS256/384/512, ECDSA keys only the ES
	// algorithm of their curve, Ed25519 keys only EdDSA.
	PublicKey string `json:"public_key,omitempty"`

	// URL of a JSON Web Key Set (for example an identity provider's
	// jwks_uri). RSA, EC (P-256, P-384, P-521) and OKP (Ed25519) signature
	// keys are used; the token's kid selects the key. The set is fetched at
	// startup, refreshed every jwks_refresh, and refetched (at most once a
	// minute) when a token names an unknown kid.
	JWKSURL string `json:"jwks_url,omitempty"`

	// Required value of the iss claim. Empty: not checked.
	Issuer string `json:"issuer,omitempty"`

	// Value the aud claim must contain. Empty: not checked.
	Audience string `json:"audience,omitempty"`

	// Read claims without checking the signature. Only for tokens already
	// verified in front of Caddy: anyone can forge an unverified token and
	// choose their own bucket. exp, nbf, iss and aud are still checked, and
	// `alg: none` is still refused. Cannot be combined with secret,
	// public_key or jwks_url.
	AllowUnverified bool `json:"allow_unverified,omitempty"`

	// Clock skew tolerated when checking exp and nbf. Default: 30s.
	Leeway caddy.Duration `json:"leeway,omitempty"`

	// How often the JWKS is fetched again. Default: 5m; values are clamped
	// to between 1m and 24h. A cached verification never outlives it.
	JWKSRefresh caddy.Duration `json:"jwks_refresh,omitempty"`

	// Test hooks; zero means the production value.
	jwksRefreshOverride time.Duration
	jwksMissInterval    time.Duration
	jwksRetryMin        time.Duration
	httpClient          *http.Client
	now                 func() time.Time
}

// TokenSource names the one place of the request a token is read from.
// Exactly one field is set.
type TokenSource struct {
	// Request header holding the token. A "Bearer " prefix is removed; for
	// the Authorization header it is required.
	Header string `json:"header,omitempty"`
	// Cookie holding the token.
	Cookie string `json:"cookie,omitempty"`
	// Query-string parameter holding the token.
	Query string `json:"query,omitempty"`
}

// UnmarshalCaddyfile parses a `jwt` block. The dispenser is positioned on
// the `jwt` token (or just before it); the token and its whole block are
// consumed. Syntax:
//
//	jwt {
//		from header <name> | cookie <name> | query <name>
//		secret <secret>
//		public_key <pem file>
//		jwks_url <url>
//		issuer <iss>
//		audience <aud>
//		allow_unverified
//		leeway <duration>
//		jwks_refresh <duration>
//	}
//
// Unknown or repeated subdirectives are errors carrying the line.
func (j *JWTConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.Val() != "jwt" && (!d.Next() || d.Val() != "jwt") {
		return d.Errf("expected jwt, got %q", d.Val())
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if seen[sub] {
			return d.Errf("jwt: %s specified more than once", sub)
		}
		seen[sub] = true
		switch sub {
		case "from":
			var kind, name string
			if !d.Args(&kind, &name) || d.NextArg() {
				return d.ArgErr()
			}
			switch kind {
			case "header":
				j.From = &TokenSource{Header: name}
			case "cookie":
				j.From = &TokenSource{Cookie: name}
			case "query":
				j.From = &TokenSource{Query: name}
			default:
				return d.Errf("jwt: from %q: want header, cookie or query", kind)
			}
		case "secret", "public_key", "jwks_url", "issuer", "audience":
			var val string
			if !d.Args(&val) || d.NextArg() {
				return d.ArgErr()
			}
			switch sub {
			case "secret":
				j.Secret = val
			case "public_key":
				j.PublicKey = val
			case "jwks_url":
				j.JWKSURL = val
			case "issuer":
				j.Issuer = val
			case "audience":
				j.Audience = val
			}
		case "allow_unverified":
			if d.NextArg() {
				return d.ArgErr()
			}
			j.AllowUnverified = true
		case "leeway", "jwks_refresh":
			var val string
			if !d.Args(&val) || d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(val)
			if err != nil {
				return d.Errf("jwt: %s %q: %v", sub, val, err)
			}
			if sub == "leeway" {
				j.Leeway = caddy.Duration(dur)
			} else {
				j.JWKSRefresh = caddy.Duration(dur)
			}
		default:
			return d.Errf("jwt: unrecognized subdirective %q", sub)
		}
	}
	return nil
}

// Validate refuses configurations that would verify nothing or be ambiguous:
// no way to check signatures (without allow_unverified), several ways,
// allow_unverified together with a key, a token source naming not exactly
// one place, negative durations, jwks_refresh without jwks_url, and a
// jwks_url that is not an absolute http(s) URL. Messages do not repeat
// "jwt": the handler prefixes them.
func (j *JWTConfig) Validate() error {
	keys := 0
	for _, s := range []string{j.Secret, j.PublicKey, j.JWKSURL} {
		if s != "" {
			keys++
		}
	}
	switch {
	case j.AllowUnverified && keys > 0:
		return errors.New("allow_unverified reads claims without checking signatures; it cannot be combined with secret, public_key or jwks_url")
	case !j.AllowUnverified && keys == 0:
		return errors.New("one of secret, public_key or jwks_url is required (or allow_unverified, to read claims without checking signatures)")
	case keys > 1:
		return errors.New("only one of secret, public_key and jwks_url may be set")
	}
	if f := j.From; f != nil {
		set := 0
		for _, s := range []string{f.Header, f.Cookie, f.Query} {
			if s != "" {
				set++
			}
		}
		if set != 1 {
			return errors.New("from must name exactly one of header, cookie or query")
		}
	}
	if j.Leeway < 0 {
		return fmt.Errorf("leeway %s is negative", time.Duration(j.Leeway))
	}
	if j.JWKSRefresh < 0 {
		return fmt.Errorf("jwks_refresh %s is negative", time.Duration(j.JWKSRefresh))
	}
	if j.JWKSRefresh != 0 && j.JWKSURL == "" {
		return errors.New("jwks_refresh needs jwks_url")
	}
	if j.JWKSURL != "" {
		u, err := url.Parse(j.JWKSURL)
		if err != nil {
			return fmt.Errorf("jwks_url: %w", err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("jwks_url %q is not an absolute http or https URL", j.JWKSURL)
		}
	}
	return nil
}

// tokenPlace says where a verifier reads the token.
type tokenPlace uint8

const (
	tokenInHeader tokenPlace = iota
	tokenInCookie
	tokenInQuery
)

// jwtVerifier is the runtime form of a JWTConfig: it extracts, verifies and
// caches tokens. It is safe for concurrent use.
type jwtVerifier struct {
	place        tokenPlace
	name         string
	requireBear  bool
	unverified   bool
	parser       *jwt.Parser
	validator    *jwt.Validator // allow_unverified only
	static       *jwtKeySet     // secret or public_key
	jwks         *jwksSource    // jwks_url
	leeway       time.Duration
	maxCacheTTL  time.Duration
	now          func() time.Time
	seed         maphash.Seed
	good         *jwtCache
	bad          *jwtCache
	logger       *zap.Logger
	panics       atomic.Int64
	closeOnce    sync.Once
	verifyMisses atomic.Int64 // tokens verified (not answered from cache)
}

// provision builds the verifier: it resolves placeholders in the secret,
// loads the public key, or fetches the JWKS once and starts refreshing it in
// the background. A JWKS fetch failure at startup is logged, not fatal:
// tokens fail verification until a later fetch succeeds.
func (j *JWTConfig) provision(ctx caddy.Context, logger *zap.Logger) (*jwtVerifier, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	v := &jwtVerifier{
		unverified: j.AllowUnverified,
		leeway:     time.Duration(j.Leeway),
		now:        j.now,
		seed:       maphash.MakeSeed(),
		good:       newJWTCache(jwtCacheSize),
		bad:        newJWTCache(jwtFailureCacheSize),
		logger:     logger,
		place:      tokenInHeader,
		name:       "Authorization",
	}
	if v.leeway == 0 {
		v.leeway = jwtDefaultLeeway
	}
	if v.now == nil {
		v.now = time.Now
	}
	if f := j.From; f != nil {
		switch {
		case f.Header != "":
			v.name = http.CanonicalHeaderKey(f.Header)
		case f.Cookie != "":
			v.place, v.name = tokenInCookie, f.Cookie
		default:
			v.place, v.name = tokenInQuery, f.Query
		}
	}
	v.requireBear = v.place == tokenInHeader && v.name == "Authorization"

	claimOpts := []jwt.ParserOption{
		jwt.WithLeeway(v.leeway),
		jwt.WithTimeFunc(func() time.Time { return v.now() }),
	}
	if j.Issuer != "" {
		claimOpts = append(claimOpts, jwt.WithIssuer(j.Issuer))
	}
	if j.Audience != "" {
		claimOpts = append(claimOpts, jwt.WithAudience(j.Audience))
	}
	decodeOpts := []jwt.ParserOption{jwt.WithJSONNumber(), jwt.WithStrictDecoding()}

	var methods []string
	v.maxCacheTTL = jwtStaticCacheTTL
	switch {
	case j.AllowUnverified:
		v.parser = jwt.NewParser(decodeOpts...)
		v.validator = jwt.NewValidator(claimOpts...)
		logger.Warn("jwt: allow_unverified is set: claims are read without checking signatures, so clients can choose their own keys")
	case j.Secret != "":
		secret, err := caddy.NewReplacer().ReplaceOrErr(j.Secret, true, true)
		if err != nil {
			return nil, fmt.Errorf("resolving secret: %w", err)
		}
		if len(secret) < 32 {
			logger.Warn("jwt: HMAC secret is shorter than 32 bytes; it may be guessed offline from any token", zap.Int("length", len(secret)))
		}
		v.static = newJWTKeySet([]*jwtKey{{key: []byte(secret), algs: jwtHMACAlgs}}, true, 0)
		methods = jwtHMACAlgs
	case j.PublicKey != "":
		key, err := loadPEMPublicKey(j.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("public_key: %w", err)
		}
		algs, err := jwtPublicKeyAlgs(key)
		if err != nil {
			return nil, fmt.Errorf("public_key %s: %w", j.PublicKey, err)
		}
		v.static = newJWTKeySet([]*jwtKey{{key: key, algs: algs}}, true, 0)
		methods = algs
	default:
		src := &jwksSource{
			url:          j.JWKSURL,
			client:       j.httpClient,
			logger:       logger.With(zap.String("jwks_url", j.JWKSURL)),
			refresh:      j.jwksRefreshInterval(logger),
			missInterval: j.jwksMissInterval,
			retryMin:     j.jwksRetryMin,
			now:          v.now,
			kick:         make(chan struct{}, 1),
		}
		if src.client == nil {
			src.client = &http.Client{Timeout: jwksTimeout}
		}
		if src.missInterval == 0 {
			src.missInterval = jwksMissInterval
		}
		if src.retryMin == 0 {
			src.retryMin = jwksRetryMin
		}
		src.set.Store(newJWTKeySet(nil, false, 0))
		err := src.fetch(ctx)
		if err != nil {
			logger.Error("jwt: initial JWKS fetch failed; tokens fail verification until a fetch succeeds", zap.Error(err))
		}
		src.start(ctx, err == nil)
		v.jwks = src
		v.maxCacheTTL = src.refresh
		methods = jwtAsymmetric
	}
	if !j.AllowUnverified {
		opts := append(append([]jwt.ParserOption{jwt.WithValidMethods(methods)}, decodeOpts...), claimOpts...)
		v.parser = jwt.NewParser(opts...)
	}
	return v, nil
}

// jwksRefreshInterval returns jwks_refresh (or its test override) with the
// default applied and clamped to [1m, 24h].
func (j *JWTConfig) jwksRefreshInterval(logger *zap.Logger) time.Duration {
	if j.jwksRefreshOverride > 0 {
		return j.jwksRefreshOverride
	}
	d := time.Duration(j.JWKSRefresh)
	switch {
	case d == 0:
		return jwksDefaultRefresh
	case d < jwksMinRefresh:
		logger.Warn("jwt: jwks_refresh raised to the minimum", zap.Duration("configured", d), zap.Duration("used", jwksMinRefresh))
		return jwksMinRefresh
	case d > jwksMaxRefresh:
		logger.Warn("jwt: jwks_refresh lowered to the maximum", zap.Duration("configured", d), zap.Duration("used", jwksMaxRefresh))
		return jwksMaxRefresh
	}
	return d
}

// loadPEMPublicKey reads the first public key of a PEM file.
func loadPEMPublicKey(path string) (any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%s: no PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE block", path)
		}
		switch block.Type {
		case "PUBLIC KEY":
			key, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing public key: %w", path, err)
			}
			return key, nil
		case "RSA PUBLIC KEY":
			key, err := x509.ParsePKCS1PublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing RSA public key: %w", path, err)
			}
			return key, nil
		case "CERTIFICATE":
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing certificate: %w", path, err)
			}
			return cert.PublicKey, nil
		}
	}
}

// close stops the JWKS refresh goroutine, if any. It is idempotent.
func (v *jwtVerifier) close() {
	if v == nil {
		return
	}
	v.closeOnce.Do(func() {
		if v.jwks != nil {
			v.jwks.close()
		}
	})
}

// keys returns the key set in use (nil with allow_unverified).
func (v *jwtVerifier) keys() *jwtKeySet {
	if v.jwks != nil {
		return v.jwks.current()
	}
	return v.static
}

// claims extracts the token from r and returns its claims if it verifies.
// ok is false when there is no token or it fails in any way (signature,
// algorithm, exp or nbf beyond the leeway, iss, aud, malformed). A token
// seen before is answered from a cache without being parsed again. The
// returned map is shared between requests and must not be modified.
func (v *jwtVerifier) claims(r *http.Request) (claims map[string]any, ok bool) {
	if v == nil || r == nil {
		return nil, false
	}
	token := v.extract(r)
	if token == "" || len(token) > jwtMaxTokenLen {
		return nil, false
	}
	now := v.now()
	nowNano := now.UnixNano()
	var gen uint64
	set := v.keys()
	if set != nil {
		gen = set.gen
	}
	h := maphash.String(v.seed, token)
	if c, hit := v.good.get(h, token, nowNano, gen); hit {
		return c, true
	}
	if _, hit := v.bad.get(h, token, nowNano, gen); hit {
		return nil, false
	}
	v.verifyMisses.Add(1)
	mc, until, err := v.verify(token, now, set)
	// The token may be a slice of a much larger header, cookie or query
	// string; the cache keeps a copy so it never pins the request's memory.
	token = strings.Clone(token)
	if err != nil {
		v.logger.Debug("jwt: token rejected", zap.Error(err))
		v.bad.put(h, token, nil, now.Add(jwtFailureTTL).UnixNano(), gen)
		return nil, false
	}
	v.good.put(h, token, mc, until.UnixNano(), gen)
	return mc, true
}

// extract returns the raw token from the configured place, or "".
func (v *jwtVerifier) extract(r *http.Request) string {
	var val string
	switch v.place {
	case tokenInHeader:
		val = r.Header.Get(v.name)
		if scheme, rest, found := strings.Cut(val, " "); found && strings.EqualFold(scheme, "Bearer") {
			val = rest
		} else if v.requireBear {
			return ""
		}
	case tokenInCookie:
		c, err := r.Cookie(v.name)
		if err != nil {
			return ""
		}
		val = c.Value
	case tokenInQuery:
		if r.URL == nil {
			return ""
		}
		val = queryValue(r.URL.RawQuery, v.name)
	}
	return strings.TrimSpace(val)
}

// queryValue returns the first value of the query parameter name, as
// url.Values.Get would, without building the whole map on every request.
func queryValue(rawQuery, name string) string {
	for rest := rawQuery; rest != ""; {
		var pair string
		pair, rest, _ = strings.Cut(rest, "&")
		if strings.Contains(pair, ";") {
			continue // refused by url.ParseQuery too
		}
		key, val, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(key, "%+") {
			var err error
			if key, err = url.QueryUnescape(key); err != nil {
				continue
			}
		}
		if key != name {
			continue
		}
		if strings.ContainsAny(val, "%+") {
			unescaped, err := url.QueryUnescape(val)
			if err != nil {
				continue
			}
			val = unescaped
		}
		return val
	}
	return ""
}

// verify parses and checks token at now against the key set set. On success
// it returns the claims and the instant until which the result may be
// cached: the token's exp plus leeway, capped by maxCacheTTL.
func (v *jwtVerifier) verify(token string, now time.Time, set *jwtKeySet) (claims map[string]any, until time.Time, err error) {
	defer func() {
		if p := recover(); p != nil {
			v.panics.Add(1)
			claims, err = nil, fmt.Errorf("verifying token panicked: %v", p)
			v.logger.Error("jwt: recovered from a panic while verifying a token; the token is refused", zap.Any("panic", p))
		}
	}()
	mc := jwt.MapClaims{}
	if v.unverified {
		t, _, err := v.parser.ParseUnverified(token, mc)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("parsing token: %w", err)
		}
		if t.Method == nil || t.Method == jwt.SigningMethodNone || t.Method.Alg() == "none" {
			return nil, time.Time{}, errors.New("parsing token: alg none refused")
		}
		if err := v.validator.Validate(mc); err != nil {
			return nil, time.Time{}, fmt.Errorf("validating claims: %w", err)
		}
	} else {
		if set == nil {
			return nil, time.Time{}, errors.New("no verification keys")
		}
		_, err := v.parser.ParseWithClaims(token, mc, func(t *jwt.Token) (any, error) {
			return v.keyFor(t, set)
		})
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("verifying token: %w", err)
		}
	}
	until = now.Add(v.maxCacheTTL)
	if exp, err := mc.GetExpirationTime(); err == nil && exp != nil {
		if e := exp.Add(v.leeway); e.Before(until) {
			until = e
		}
	}
	return mc, until, nil
}

// keyFor is the jwt.Keyfunc: it picks the key by kid and refuses any key
// whose type does not fit the token's algorithm.
func (v *jwtVerifier) keyFor(t *jwt.Token, set *jwtKeySet) (any, error) {
	if t.Method == nil {
		return nil, errors.New("no signing method")
	}
	kid, hasKid := "", false
	if raw, present := t.Header["kid"]; present {
		s, isString := raw.(string)
		if !isString {
			return nil, errors.New("kid is not a string")
		}
		kid, hasKid = s, true
	}
	key, miss, err := set.find(kid, hasKid, t.Method)
	if miss && v.jwks != nil {
		v.jwks.requestRefetch()
	}
	return key, err
}

// lookupClaim reads the claim at path, where dots reach into nested objects
// (org.id), and renders it as a key: strings as they are, numbers in plain
// decimal without exponent or trailing zeros (integral values as integers),
// booleans as true or false. Objects, arrays, null and missing claims give
// ok=false. A top-level claim whose name itself contains dots (a namespaced
// claim such as https://example.com/org) is matched whole first.
func lookupClaim(claims map[string]any, path string) (string, bool) {
	if claims == nil || path == "" {
		return "", false
	}
	val, found := claims[path]
	if !found {
		var cur any = map[string]any(claims)
		for rest, more := path, true; more; {
			var seg string
			seg, rest, more = strings.Cut(rest, ".")
			if seg == "" {
				return "", false
			}
			var m map[string]any
			switch x := cur.(type) {
			case map[string]any:
				m = x
			case jwt.MapClaims:
				m = x
			default:
				return "", false
			}
			if cur, found = m[seg]; !found {
				return "", false
			}
		}
		val = cur
	}
	return renderClaim(val)
}

// renderClaim renders a scalar claim value as a key string.
func renderClaim(val any) (string, bool) {
	switch x := val.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case json.Number:
		return renderDecimal(string(x))
	case float64:
		return renderFloat(x, 64)
	case float32:
		return renderFloat(float64(x), 32)
	case int:
		return strconv.Itoa(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case uint32:
		return strconv.FormatUint(uint64(x), 10), true
	case uint:
		return strconv.FormatUint(uint64(x), 10), true
	}
	return "", false
}

func renderFloat(f float64, bits int) (string, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", false
	}
	if f == 0 {
		return "0", true // also -0
	}
	return strconv.FormatFloat(f, 'f', -1, bits), true
}

// renderMaxPadding bounds the zeros an exponent may add when a number is
// written out in plain decimal (1e400 would otherwise be 401 characters);
// beyond it the number is not usable as a key.
const renderMaxPadding = 400

// renderDecimal rewrites a JSON number literal exactly in plain decimal:
// no exponent, no leading or trailing zeros, "-" only for non-zero values.
// Digits are never lost, so 12345678901234567890 stays as it is.
func renderDecimal(s string) (string, bool) {
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	i, neg := 0, false
	if i < len(s) && s[i] == '-' {
		neg, i = true, i+1
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[start:i]
	if intPart == "" {
		return "", false
	}
	var frac string
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if frac = s[start:i]; frac == "" {
			return "", false
		}
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg, i = s[i] == '-', i+1
		}
		start = i
		for ; i < len(s) && isDigit(s[i]); i++ {
			if exp < 1e9 {
				exp = exp*10 + int(s[i]-'0')
			}
		}
		if start == i {
			return "", false
		}
		if expNeg {
			exp = -exp
		}
	}
	if i != len(s) {
		return "", false
	}

	// digits with the decimal point after point digits (point may be
	// negative or beyond the digits).
	digits := intPart + frac
	point := len(intPart) + exp
	lead := len(digits) - len(strings.TrimLeft(digits, "0"))
	digits, point = digits[lead:], point-lead
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return "0", true
	}
	if point > len(digits)+renderMaxPadding || point < -renderMaxPadding {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(digits) + renderMaxPadding/8 + 3)
	if neg {
		b.WriteByte('-')
	}
	switch {
	case point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(digits)
	case point >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", point-len(digits)))
	default:
		b.WriteString(digits[:point])
		b.WriteByte('.')
		b.WriteString(digits[point:])
	}
	return b.String(), true
}

// Interface guard: the jwt block is parsed by the handler's parser.
var _ caddyfile.Unmarshaler = (*JWTConfig)(nil)

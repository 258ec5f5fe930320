package jwtauth

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Bounds of the verified-token cache.
const (
	// cacheSize and failureCacheSize bound the verified-token cache and
	// the cache of failed tokens.
	cacheSize        = 10000
	failureCacheSize = 4096
	// failureTTL is how long a failed token is remembered, so a flood of
	// one bad token costs one verification per interval.
	failureTTL = 10 * time.Second
	// staticCacheTTL caps how long a token verified with a configured
	// secret or public key is cached (tokens without exp included). With a
	// JWKS the cap is the refresh interval instead.
	staticCacheTTL = 10 * time.Minute
)

// Verifier extracts, verifies and caches the tokens of requests. Building
// one loads keys and may start a background refresh, so a server builds it
// once per configuration and shares it between requests; it is safe for
// concurrent use, and Close releases it.
type Verifier struct {
	place         Place
	name          string
	requireBearer bool
	unverified    bool
	parser        *jwt.Parser
	validator     *jwt.Validator // AllowUnverified only
	static        *keySet        // Secret or PublicKeyFile
	jwks          *jwksSource    // JWKSURL
	leeway        time.Duration
	maxCacheTTL   time.Duration
	clock         limiter.Clock
	seed          maphash.Seed
	good          *cache
	bad           *cache
	logger        *zap.Logger
	panics        atomic.Int64
	closeOnce     sync.Once
	verifications atomic.Int64 // tokens verified (not answered from cache)
}

// New builds a Verifier from o: it loads the public key, or fetches the
// JWKS once and starts refreshing it in the background until ctx ends or
// Close is called. A JWKS fetch failure is logged, not returned: tokens
// fail verification until a later fetch succeeds, rather than a server
// refusing to start because its identity provider is briefly down.
func New(ctx context.Context, o Options) (*Verifier, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	logger := o.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	clock := o.Clock
	if clock == nil {
		clock = limiter.SystemClock
	}
	v := &Verifier{
		place:       o.Place,
		name:        o.Name,
		unverified:  o.AllowUnverified,
		leeway:      cmpOr(o.Leeway, DefaultLeeway),
		maxCacheTTL: staticCacheTTL,
		clock:       clock,
		seed:        maphash.MakeSeed(),
		good:        newCache(cacheSize),
		bad:         newCache(failureCacheSize),
		logger:      logger,
	}
	if v.place == Header {
		if v.name == "" {
			v.name = "Authorization"
		}
		v.name = http.CanonicalHeaderKey(v.name)
		v.requireBearer = v.name == "Authorization"
	}

	claimOpts := []jwt.ParserOption{
		jwt.WithLeeway(v.leeway),
		jwt.WithTimeFunc(clock.Now),
	}
	if o.Issuer != "" {
		claimOpts = append(claimOpts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		claimOpts = append(claimOpts, jwt.WithAudience(o.Audience))
	}
	decodeOpts := []jwt.ParserOption{jwt.WithJSONNumber(), jwt.WithStrictDecoding()}

	var methods []string
	switch {
	case o.AllowUnverified:
		v.parser = jwt.NewParser(decodeOpts...)
		v.validator = jwt.NewValidator(claimOpts...)
		logger.Warn("jwt: allow_unverified is set: claims are read without checking signatures, so clients can choose their own keys")
		return v, nil
	case len(o.Secret) > 0:
		if len(o.Secret) < 32 {
			logger.Warn("jwt: HMAC secret is shorter than 32 bytes; it may be guessed offline from any token", zap.Int("length", len(o.Secret)))
		}
		secret := append([]byte(nil), o.Secret...)
		v.static = newKeySet([]*key{{pub: secret, algs: hmacAlgs}}, true, 0)
		methods = hmacAlgs
	case o.PublicKeyFile != "":
		pub, err := loadPEMPublicKey(o.PublicKeyFile)
		if err != nil {
			return nil, fmt.Errorf("public key: %w", err)
		}
		algs, err := publicKeyAlgs(pub)
		if err != nil {
			return nil, fmt.Errorf("public key %s: %w", o.PublicKeyFile, err)
		}
		v.static = newKeySet([]*key{{pub: pub, algs: algs}}, true, 0)
		methods = algs
	default:
		src := newJWKSSource(&o, clock, logger)
		err := src.fetch(ctx)
		if err != nil {
			logger.Error("jwt: initial JWKS fetch failed; tokens fail verification until a fetch succeeds", zap.Error(err))
		}
		src.start(ctx, err == nil)
		v.jwks = src
		v.maxCacheTTL = src.refresh
		methods = asymmetricAlgs
	}
	opts := append(append([]jwt.ParserOption{jwt.WithValidMethods(methods)}, decodeOpts...), claimOpts...)
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Close stops the JWKS refresh goroutine, if any. It is idempotent and
// safe on a nil Verifier, so a handler can call it on every cleanup path.
func (v *Verifier) Close() {
	if v == nil {
		return
	}
	v.closeOnce.Do(func() {
		if v.jwks != nil {
			v.jwks.close()
		}
	})
}

// Verifications counts the tokens checked in full rather than answered
// from the cache, so callers and benchmarks can tell whether the cache
// does its work.
func (v *Verifier) Verifications() int64 { return v.verifications.Load() }

// keys returns the key set in use (nil with AllowUnverified).
func (v *Verifier) keys() *keySet {
	if v.jwks != nil {
		return v.jwks.current()
	}
	return v.static
}

// Claims extracts the token from r and returns its claims if it verifies.
// ok is false when there is no token or it fails in any way (signature,
// algorithm, exp or nbf beyond the leeway, iss, aud, malformed): a caller
// keying limits by claims must then treat the request as having no key,
// never as a client of its own. A token seen before is answered from a
// cache without being parsed again. The returned map is shared between
// requests and must not be modified. A nil Verifier verifies nothing.
func (v *Verifier) Claims(r *http.Request) (claims Claims, ok bool) {
	if v == nil || r == nil {
		return nil, false
	}
	token := v.extract(r)
	if token == "" || len(token) > maxTokenLen {
		return nil, false
	}
	now := v.clock.Now()
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
	v.verifications.Add(1)
	mc, until, err := v.verify(token, now, set)
	// The token may be a slice of a much larger header, cookie or query
	// string; the cache keeps a copy so it never pins the request's memory.
	token = strings.Clone(token)
	if err != nil {
		v.logger.Debug("jwt: token rejected", zap.Error(err))
		v.bad.put(h, token, nil, now.Add(failureTTL).UnixNano(), gen)
		return nil, false
	}
	v.good.put(h, token, mc, until.UnixNano(), gen)
	return mc, true
}

// verify parses and checks token at now against the key set set. On success
// it returns the claims and the instant until which the result may be
// cached: the token's exp plus leeway, capped by maxCacheTTL. A panic in
// the parser refuses the token rather than the whole request.
func (v *Verifier) verify(token string, now time.Time, set *keySet) (claims Claims, until time.Time, err error) {
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
	return Claims(mc), until, nil
}

// keyFor is the jwt.Keyfunc: it picks the key by kid and refuses any key
// whose type does not fit the token's algorithm.
func (v *Verifier) keyFor(t *jwt.Token, set *keySet) (any, error) {
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
	pub, miss, err := set.find(kid, hasKid, t.Method)
	if miss && v.jwks != nil {
		v.jwks.requestRefetch()
	}
	return pub, err
}

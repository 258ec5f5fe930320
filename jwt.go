package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwtauth"
)

// Bounds of jwks_refresh: often enough to follow a rotation, rarely enough
// not to hammer the identity provider.
const (
	jwksMinRefresh = time.Minute
	jwksMaxRefresh = 24 * time.Hour
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
			if dur < 0 {
				return d.Errf("jwt: %s %q must not be negative", sub, val)
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

// newVerifier builds the verifier j describes: placeholders in the secret
// are resolved (they may name environment variables), jwks_refresh is
// bounded, and the rest is handed to jwtauth as configured.
func (j *JWTConfig) newVerifier(ctx context.Context, logger *zap.Logger) (*jwtauth.Verifier, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	o := jwtauth.Options{
		PublicKeyFile:   j.PublicKey,
		JWKSURL:         j.JWKSURL,
		Issuer:          j.Issuer,
		Audience:        j.Audience,
		AllowUnverified: j.AllowUnverified,
		Leeway:          time.Duration(j.Leeway),
		Logger:          logger,
	}
	if f := j.From; f != nil {
		switch {
		case f.Header != "":
			o.Place, o.Name = jwtauth.Header, f.Header
		case f.Cookie != "":
			o.Place, o.Name = jwtauth.Cookie, f.Cookie
		default:
			o.Place, o.Name = jwtauth.Query, f.Query
		}
	}
	if j.Secret != "" {
		secret, err := caddy.NewReplacer().ReplaceOrErr(j.Secret, true, true)
		if err != nil {
			return nil, fmt.Errorf("resolving secret: %w", err)
		}
		o.Secret = []byte(secret)
	}
	if j.JWKSURL != "" {
		o.JWKSRefresh = j.jwksRefreshInterval(logger)
	}
	return jwtauth.New(ctx, o)
}

// jwksRefreshInterval returns jwks_refresh clamped to [1m, 24h], warning
// when it had to move; zero leaves jwtauth's default of 5m.
func (j *JWTConfig) jwksRefreshInterval(logger *zap.Logger) time.Duration {
	d := time.Duration(j.JWKSRefresh)
	switch {
	case d == 0:
		return 0
	case d < jwksMinRefresh:
		logger.Warn("jwt: jwks_refresh raised to the minimum", zap.Duration("configured", d), zap.Duration("used", jwksMinRefresh))
		return jwksMinRefresh
	case d > jwksMaxRefresh:
		logger.Warn("jwt: jwks_refresh lowered to the maximum", zap.Duration("configured", d), zap.Duration("used", jwksMaxRefresh))
		return jwksMaxRefresh
	}
	return d
}

// Interface guard: the jwt block is parsed by the handler's parser.
var _ caddyfile.Unmarshaler = (*JWTConfig)(nil)

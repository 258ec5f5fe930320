package ratelimit

import (
	"context"
	"errors"
	"fmt"
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
// Refusals are worded as every block's are (see option) and carry the
// line; the block is checked when it closes, as validate checks it.
func (j *JWTConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.Val() != "jwt" && (!d.Next() || d.Val() != "jwt") {
		return refuse(d, "want a jwt block, got '%s'", d.Val())
	}
	return parseOptionBlock(d, "jwt", j.options(), j.validate)
}

// options is the jwt block's option table, each option filling its field
// of j. Its durations are checked here only for the syntax of a duration
// and a sign; jwtauth checks the block as a whole.
func (j *JWTConfig) options() map[string]option {
	return map[string]option{
		"from": {args: "header | cookie | query <name>", parse: func(d *caddyfile.Dispenser) error {
			var kind, name string
			if !d.Args(&kind, &name) || d.NextArg() {
				return errArgCount
			}
			switch kind {
			case "header":
				j.From = &TokenSource{Header: name}
			case "cookie":
				j.From = &TokenSource{Cookie: name}
			case "query":
				j.From = &TokenSource{Query: name}
			default:
				return fmt.Errorf("want header, cookie or query, got %q", kind)
			}
			return nil
		}},
		"secret":           stringOption("<secret>", &j.Secret),
		"public_key":       stringOption("<pem file>", &j.PublicKey),
		"jwks_url":         stringOption("<url>", &j.JWKSURL),
		"issuer":           stringOption("<iss>", &j.Issuer),
		"audience":         stringOption("<aud>", &j.Audience),
		"allow_unverified": flagOption(&j.AllowUnverified),
		// 0 is jwtauth's default for both.
		"leeway":       durationOption(&j.Leeway, durationBound{name: "leeway", zeroMeans: true}),
		"jwks_refresh": durationOption(&j.JWKSRefresh, durationBound{name: "jwks_refresh", zeroMeans: true}),
	}
}

// validate refuses a jwt block that would verify nothing or be ambiguous:
// jwtauth.Options.Validate, the one check of the verifier's options, on
// the block as written. Messages do not say "jwt": the caller does.
func (j *JWTConfig) validate() error {
	o, err := j.verifierOptions()
	if err != nil {
		return err
	}
	return o.Validate()
}

// verifierOptions is j in jwtauth's terms, as written: the secret's
// placeholders unresolved, jwks_refresh not yet bounded. Only a token
// source naming not exactly one place, which jwtauth's options cannot
// express, is refused here.
func (j *JWTConfig) verifierOptions() (jwtauth.Options, error) {
	o := jwtauth.Options{
		Secret:          []byte(j.Secret),
		PublicKeyFile:   j.PublicKey,
		JWKSURL:         j.JWKSURL,
		Issuer:          j.Issuer,
		Audience:        j.Audience,
		AllowUnverified: j.AllowUnverified,
		Leeway:          time.Duration(j.Leeway),
		JWKSRefresh:     time.Duration(j.JWKSRefresh),
	}
	if f := j.From; f != nil {
		switch {
		case f.Header != "" && f.Cookie == "" && f.Query == "":
			o.Place, o.Name = jwtauth.Header, f.Header
		case f.Cookie != "" && f.Header == "" && f.Query == "":
			o.Place, o.Name = jwtauth.Cookie, f.Cookie
		case f.Query != "" && f.Header == "" && f.Cookie == "":
			o.Place, o.Name = jwtauth.Query, f.Query
		default:
			return jwtauth.Options{}, errors.New("from must name exactly one of header, cookie or query")
		}
	}
	return o, nil
}

// newVerifier builds the verifier j describes: placeholders in the secret
// are resolved (they may name environment variables), jwks_refresh is
// bounded, and the rest is handed to jwtauth, which checks it.
func (j *JWTConfig) newVerifier(ctx context.Context, logger *zap.Logger) (*jwtauth.Verifier, error) {
	o, err := j.verifierOptions()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	o.Logger = logger
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
// when it had to move; zero leaves jwtauth's default of 5m, and a negative
// one is left for jwtauth to refuse.
func (j *JWTConfig) jwksRefreshInterval(logger *zap.Logger) time.Duration {
	d := time.Duration(j.JWKSRefresh)
	switch {
	case d <= 0:
		return d
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

package jwtauth

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Place is the part of a request a token is read from. Tokens travel in
// different places depending on the client (APIs send headers, browsers
// cookies, WebSocket upgrades the query string), so the operator chooses.
type Place uint8

// The places a token can be read from.
const (
	// Header reads a request header; a "Bearer " prefix is removed, and for
	// the Authorization header it is required.
	Header Place = iota
	// Cookie reads the named cookie.
	Cookie
	// Query reads the first value of the named query-string parameter.
	Query
)

// DefaultLeeway is the clock skew tolerated between the token's issuer and
// this server when Options.Leeway is zero: clocks of different machines
// never agree exactly, and refusing a token a second early or late would
// move a client to the missing-key bucket for no fault of its own.
const DefaultLeeway = 30 * time.Second

// Options configures a Verifier. Exactly one of Secret, PublicKeyFile and
// JWKSURL says how signatures are checked, unless AllowUnverified is set;
// the remaining fields have working zero values, so production callers set
// only what the operator configured and tests set the clock and timings.
type Options struct {
	// Place and Name say where the token is read. The zero value is the
	// Authorization header with the Bearer scheme; an empty Name with
	// Header means Authorization.
	Place Place
	Name  string

	// Secret verifies HMAC-signed tokens (HS256, HS384, HS512). It is
	// taken as given: resolving placeholders is the caller's business.
	Secret []byte
	// PublicKeyFile is a PEM file holding a PKIX "PUBLIC KEY", an
	// "RSA PUBLIC KEY" or a "CERTIFICATE"; the key's type decides which
	// algorithms it may verify.
	PublicKeyFile string
	// JWKSURL is fetched at New, every JWKSRefresh, and when a token names
	// a kid the set does not hold.
	JWKSURL string

	// Issuer and Audience, when set, must match the iss claim and be one
	// of the aud claim's values.
	Issuer   string
	Audience string

	// AllowUnverified reads claims without checking signatures, for tokens
	// verified by something in front of this server. exp, nbf, iss and aud
	// are still checked and alg none is still refused.
	AllowUnverified bool

	// Leeway is the clock skew tolerated on exp and nbf; zero means
	// DefaultLeeway.
	Leeway time.Duration

	// JWKSRefresh is how often the key set is fetched again, used as
	// given (bounding an operator's value is the caller's business); zero
	// means five minutes. A cached verification never outlives it, so a
	// revoked key stops working within one interval.
	JWKSRefresh time.Duration
	// JWKSMissInterval is the least time between two refetches asked for
	// by tokens naming an unknown kid, so made-up kids cannot turn into a
	// flood of requests to the identity provider. Zero means a minute.
	JWKSMissInterval time.Duration
	// JWKSRetryMin is the first delay before retrying a failed fetch; it
	// doubles up to JWKSRefresh. Zero means five seconds.
	JWKSRetryMin time.Duration
	// HTTPClient fetches the key set. Nil means a client with a 10s
	// timeout, so a hanging identity provider cannot hold a fetch forever.
	HTTPClient *http.Client

	// Clock tells the time for exp, nbf, cache expiry and refetch limits.
	// Nil means limiter.SystemClock.
	Clock limiter.Clock
	// Logger receives warnings about weak or skipped keys and failed
	// fetches, and debug lines for refused tokens. Nil discards them.
	Logger *zap.Logger
}

// Validate refuses options that would verify nothing or be ambiguous: no
// way to check signatures (without AllowUnverified), several ways,
// AllowUnverified together with a key, negative durations, JWKSRefresh
// without JWKSURL, and a JWKSURL that is not an absolute http(s) URL. It
// is the one check of these fields: New runs it, and the adapter runs it
// on its jwt block to refuse a config before it loads. Its messages name
// the fields as the jwt block spells them, and not the block: the caller
// says which block.
func (o Options) Validate() error {
	keys := 0
	for _, set := range []bool{len(o.Secret) > 0, o.PublicKeyFile != "", o.JWKSURL != ""} {
		if set {
			keys++
		}
	}
	switch {
	case o.AllowUnverified && keys > 0:
		return errors.New("allow_unverified reads claims without checking signatures; it cannot be combined with secret, public_key or jwks_url")
	case !o.AllowUnverified && keys == 0:
		return errors.New("one of secret, public_key or jwks_url is required (or allow_unverified, to read claims without checking signatures)")
	case keys > 1:
		return errors.New("only one of secret, public_key and jwks_url may be set")
	case o.Leeway < 0:
		return fmt.Errorf("leeway must not be negative, got %v", o.Leeway)
	case o.JWKSRefresh < 0:
		return fmt.Errorf("jwks_refresh must not be negative, got %v", o.JWKSRefresh)
	case o.JWKSRefresh != 0 && o.JWKSURL == "":
		return errors.New("jwks_refresh needs jwks_url")
	}
	if o.JWKSURL != "" {
		u, err := url.Parse(o.JWKSURL)
		if err != nil {
			return fmt.Errorf("jwks_url: %w", err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("jwks_url %q is not an absolute http or https URL", u.Redacted())
		}
		if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
			return fmt.Errorf("jwks_url %q is plain http: anyone on the path could swap the keys and sign any token; use https (plain http is taken only for a loopback host)", u.Redacted())
		}
	}
	return nil
}

// loopbackHost reports whether host names this machine: localhost or a
// loopback address, the only hosts a key set is fetched from over plain
// http (a sidecar or a local identity provider).
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

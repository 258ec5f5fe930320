package ratelimit

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// jwtPlaceholders resolves {jwt.<claim>} for one request from its verified
// token. The token is parsed at most once, on the first lookup, however
// many zones, tiers or later handlers read its claims.
type jwtPlaceholders struct {
	v      *jwtVerifier
	r      *http.Request
	done   bool
	ok     bool
	claims map[string]any
}

// jwtProviderProbe is a replacer key that the request's {jwt.*} provider
// answers with itself. No placeholder written in a Caddyfile can hold the
// NUL byte, so only provideJWTPlaceholders asks for it.
const jwtProviderProbe = "\x00floodgate.jwt_provider"

// provideJWTPlaceholders makes {jwt.*} on repl answer from v's verification
// of r's token. A replacer asks its providers in the order they were added
// and takes the first answer, so when a second rate_limit handler (with a
// jwt block of its own) serves the same request, mapping another provider
// would change nothing: that handler's zones would be keyed by claims the
// first handler's jwt block accepted, possibly with another key or with
// allow_unverified. Instead the request's provider is pointed at this
// handler's verifier, so each handler's zones are keyed by what its own
// jwt block verified, and later handlers see the last one's view.
func provideJWTPlaceholders(repl *caddy.Replacer, r *http.Request, v *jwtVerifier) {
	if cur, ok := repl.Get(jwtProviderProbe); ok {
		if p, ok := cur.(*jwtPlaceholders); ok {
			if p.v != v || p.r != r {
				*p = jwtPlaceholders{v: v, r: r}
			}
			return
		}
	}
	p := &jwtPlaceholders{v: v, r: r}
	repl.Map(p.replace)
}

// replace answers jwt.<path> with the claim as a key string. A missing,
// invalid or unverifiable token, or a missing claim, is an empty value:
// to a zone key that is a missing key, never a bucket of its own.
func (p *jwtPlaceholders) replace(key string) (any, bool) {
	path, found := strings.CutPrefix(key, "jwt.")
	if !found {
		if key == jwtProviderProbe {
			return p, true
		}
		return nil, false
	}
	if !p.done {
		p.claims, p.ok = p.v.claims(p.r)
		p.done = true
	}
	if !p.ok {
		return "", true
	}
	v, ok := lookupClaim(p.claims, path)
	if !ok {
		return "", true
	}
	return v, true
}

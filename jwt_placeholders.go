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

// provideJWTPlaceholders makes {jwt.*} available on repl for r.
func provideJWTPlaceholders(repl *caddy.Replacer, r *http.Request, v *jwtVerifier) {
	p := &jwtPlaceholders{v: v, r: r}
	repl.Map(p.replace)
}

// replace answers jwt.<path> with the claim as a key string. A missing,
// invalid or unverifiable token, or a missing claim, is an empty value:
// to a zone key that is a missing key, never a bucket of its own.
func (p *jwtPlaceholders) replace(key string) (any, bool) {
	path, found := strings.CutPrefix(key, "jwt.")
	if !found {
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

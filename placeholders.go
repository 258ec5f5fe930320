package ratelimit

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwtauth"
)

// requestPlaceholders answers the placeholders rate_limit handlers provide
// for one request: {jwt.<claim>} from the handler's jwt block, and
// {http.rate_limit.*} from the last decision.
//
// One provider per request, mapped on the replacer the first time a
// handler needs it and found again through the request's vars. Two reasons
// not to use repl.Set or a provider per handler:
//   - A replacer asks its providers in the order they were added and takes
//     the first answer, so a second rate_limit handler on the same request
//     must update the first one's provider, not add another, for its
//     decision and its own jwt block to be what later handlers see.
//   - The first repl.Set on a request makes Caddy allocate the replacer's
//     static map, and boxing the counts allocates again: together several
//     times what the decision itself costs under load. A provider boxes a
//     value only when something asks for it.
//
// A request is served by one goroutine at a time, and its handlers and
// logs read placeholders after the handler that sets them, so the fields
// need no lock.
type requestPlaceholders struct {
	repl *caddy.Replacer
	// jwt is the request's token as the last handler with a jwt block
	// verified it; nil until such a handler has run. A pointer, not a
	// value: most requests have no token, and the provider is allocated
	// for every request.
	jwt *jwtClaims

	// zone decided the request; nil until a handler has decided it.
	zone                  *zone
	remaining, retryAfter int64
	// exceeded is the zone that refused the request, or else the first
	// that passed it on over its limit (`exceeded pass`), if one has. A
	// later handler that admits the request leaves it as it is.
	exceeded *zone
}

// placeholdersVar is the request variable holding its requestPlaceholders.
// No variable written in a Caddyfile can hold the NUL byte.
const placeholdersVar = "\x00floodgate.placeholders"

// placeholdersFor returns r's provider, mapping it on repl on first use.
func placeholdersFor(r *http.Request, repl *caddy.Replacer) *requestPlaceholders {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if p, ok := vars[placeholdersVar].(*requestPlaceholders); ok && p.repl == repl {
		return p
	}
	p := &requestPlaceholders{repl: repl}
	repl.Map(p.replace)
	if vars != nil {
		vars[placeholdersVar] = p
	}
	return p
}

// useJWT makes {jwt.*} answer from v's verification of r's token, parsed
// at most once however many zones, tiers or later handlers read its
// claims. Each handler's zones are keyed by what its own jwt block
// verified; later handlers see the last one's view.
func (p *requestPlaceholders) useJWT(r *http.Request, v *jwtauth.Verifier) *jwtClaims {
	if p.jwt == nil || p.jwt.v != v || p.jwt.r != r {
		p.jwt = &jwtClaims{v: v, r: r}
	}
	return p.jwt
}

// decide records the decision later handlers and logs see: the refusing
// zone's, else the first passed on over its limit, or else the one with
// the least remaining (request.reported).
func (p *requestPlaceholders) decide(req *request, retry int64) {
	o := req.reported()
	p.zone, p.remaining, p.retryAfter = o.zone, o.adm.Remaining, retry
	if req.refusal >= 0 || req.passing >= 0 {
		p.exceeded = o.zone
	}
}

// replace is the replacer's view of p. A placeholder that no handler has
// set yet is unknown, so the replacer's other providers may answer it.
func (p *requestPlaceholders) replace(key string) (any, bool) {
	if name, ok := strings.CutPrefix(key, "http.rate_limit."); ok {
		if p.zone == nil {
			return nil, false
		}
		switch name {
		case "zone":
			return p.zone.placeholder, true
		case "remaining":
			return p.remaining, true
		case "retry_after":
			return p.retryAfter, true
		case "exceeded.name":
			if p.exceeded != nil {
				return p.exceeded.placeholder, true
			}
		}
		return nil, false
	}
	if path, ok := strings.CutPrefix(key, "jwt."); ok && p.jwt != nil {
		return p.jwt.claim(path), true
	}
	return nil, false
}

// jwtClaims is one request's verified token, parsed on first use.
type jwtClaims struct {
	v      *jwtauth.Verifier
	r      *http.Request
	done   bool
	ok     bool
	claims jwtauth.Claims
}

// claim is the claim at path as a key string. A missing, invalid or
// unverifiable token, or a missing claim, is an empty value: to a zone key
// that is a missing key, never a bucket of its own.
func (c *jwtClaims) claim(path string) string {
	if !c.done {
		c.claims, c.ok = c.v.Claims(c.r)
		c.done = true
	}
	if !c.ok {
		return ""
	}
	if v, ok := c.claims.Lookup(path); ok {
		return v
	}
	return ""
}

package ratelimit

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// match reports whether zone z applies to r and, if so, sets c to it with
// its limit, key and cost; a zone that applies but decides nothing is
// reported as not applying, with c undecided. claims are the request's
// verified token, or nil.
func (h *Handler) match(z *zone, r *http.Request, repl *caddy.Replacer, claims *jwtClaims, c *zoneRecord) (bool, error) {
	if len(z.matchers) > 0 {
		ok, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return false, caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if !ok {
			return false, nil
		}
	}
	*c = zoneRecord{zone: z, limit: z.limitFor(r, repl, claims)}
	key, ok := z.key.evaluate(r, repl, claims)
	if !ok {
		switch z.missing {
		case missingSkip:
			c.phase = undecided
			return false, nil
		case missingDeny:
			c.phase = blocked
			return true, nil
		default:
			key = missingKeyNamespace + z.key.clientIP(r)
		}
	}
	c.key, c.state = key, key
	if o, ok := z.ov.lookup(key); ok && o.Active(h.now()) {
		// Override, then tier, then the zone's own limit.
		if !h.applyOverride(z, o, c) {
			return false, nil
		}
	}
	if c.phase == blocked {
		return true, nil // refused whatever it would cost
	}
	if err := h.requestCost(r, repl, claims, c); err != nil {
		if !z.dryRun {
			return false, err
		}
		// dry_run never refuses: the 400 is logged (requestCost) and
		// counted as a refusal the zone would have made, and the zone
		// does not apply to this request.
		z.metrics.count(false, true, limiter.SourceStore)
		c.phase = undecided
		return false, nil
	}
	return true, nil
}

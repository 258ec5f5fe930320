package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwtauth"
)

func init() {
	caddy.RegisterModule(StatusHandler{})
}

// StatusHandler answers a client its own state in the rate limits of the
// running config, as GitHub's /rate_limit does, so a client can pace
// itself without spending a request to read the headers. It consumes
// nothing, never shows the key a zone groups the client by, and ends the
// request: nothing after it runs. The answer is JSON:
//
//	{"zones": [{"zone": "api", "limit": 100, "remaining": 97, "reset": 58, "window": 60}]}
//
// limit, remaining and window are what the RateLimit-Policy and RateLimit
// headers of the client's next request would report before it is counted;
// reset is RateLimit's t, the seconds until the client's state is back to
// full. Each zone reports the limit of the client's tier, the key found
// as the zone's own handler finds it (with that handler's jwt block), and
// ignores the zone's `match`: the status request is not one the zone
// limits. A zone is left out when it would decide the client by no key
// (`missing_key deny` or `skip` with the key missing) or its store fails
// (`fail local` answers from its in-memory fallback instead). docs/client-status.md
// shows a site and its answers.
type StatusHandler struct {
	// Zones names the zones to answer, in this order; empty means every
	// zone of the running config, by name. A name no rate_limit of the
	// running config declares is left out of the answer, and logged
	// once as a warning: rate_limit handlers load in no set order, so it
	// cannot be refused when the config loads.
	Zones []string `json:"zones,omitempty"`

	logger *zap.Logger
	// config identifies the config this handler was loaded with, as the
	// zone registry records each handler's (registered.config).
	config <-chan struct{}
	// namesChecked is done once the names in Zones have been looked up
	// in the running config, at the first request: by then every handler
	// of the config has been provisioned.
	// (A pointer: Caddy copies the zero handler to describe the module.)
	namesChecked *sync.Once
}

// CaddyModule returns the Caddy module information.
func (StatusHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_status",
		New: func() caddy.Module { return new(StatusHandler) },
	}
}

// Provision checks the zone names and notes which config the handler
// belongs to.
func (s *StatusHandler) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	s.config = ctx.Done()
	s.namesChecked = new(sync.Once)
	return s.validate()
}

// validate refuses a name no zone can have and a name given twice, in
// JSON and in the Caddyfile alike.
func (s *StatusHandler) validate() error {
	for i, name := range s.Zones {
		if err := validZoneName(name); err != nil {
			return err
		}
		if slices.Contains(s.Zones[:i], name) {
			return fmt.Errorf("zone '%s' specified twice", name)
		}
	}
	return nil
}

// zoneStatus is one zone in the answer.
type zoneStatus struct {
	Zone      string `json:"zone"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	// Reset is the seconds, rounded up, until the state is back to full.
	Reset int64 `json:"reset"`
	// Window is RateLimit-Policy's w: seconds, rounded up, at least 1.
	Window int64 `json:"window"`
}

// statusAnswer is the body of the answer; an object, so that fields can
// be added beside zones.
type statusAnswer struct {
	Zones []zoneStatus `json:"zones"`
}

// ServeHTTP answers GET and HEAD with the client's state; any other method
// is refused with 405.
func (s *StatusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("rate_limit_status answers GET and HEAD, not %s", r.Method))
	}
	s.namesChecked.Do(s.warnUnknownNames)
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return caddyhttp.Error(http.StatusInternalServerError, errors.New("rate_limit_status: the request has no replacer"))
	}
	body, err := json.Marshal(statusAnswer{Zones: s.states(r, repl)})
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rate_limit_status: encoding the answer: %w", err))
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	// The answer is one client's and changes with each of its requests.
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := w.Write(append(body, '\n')); err != nil {
		return fmt.Errorf("rate_limit_status: writing the answer: %w", err)
	}
	return nil
}

// states is r's state in each zone the handler answers for, in order. A
// name two handlers of the config declare is answered for each, and
// answers that are the same (two handlers with one limit share its state)
// once.
func (s *StatusHandler) states(r *http.Request, repl *caddy.Replacer) []zoneStatus {
	out := []zoneStatus{}
	// Each handler's verifier reads the token once, whatever the number
	// of its zones.
	claims := map[*jwtauth.Verifier]*jwtClaims{}
	for _, reg := range s.registered() {
		var c *jwtClaims
		if reg.jwt != nil {
			if c = claims[reg.jwt]; c == nil {
				c = &jwtClaims{v: reg.jwt, r: r}
				claims[reg.jwt] = c
			}
		}
		st, ok := s.statusIn(r, repl, reg.zone, c)
		if ok && !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out
}

// registered lists the zones of the handler's own config that it answers
// for: the named ones in order, else all of them by name.
func (s *StatusHandler) registered() []registered {
	var list []registered
	if len(s.Zones) == 0 {
		list = zones.all()
	} else {
		for _, name := range s.Zones {
			list = append(list, zones.named(name)...)
		}
	}
	return slices.DeleteFunc(list, func(reg registered) bool { return reg.config != s.config })
}

// statusIn is r's state in z, with claims the token as z's handler verifies
// it (nil without a jwt block); false when z is left out (see
// StatusHandler).
func (s *StatusHandler) statusIn(r *http.Request, repl *caddy.Replacer, z *zone, claims *jwtClaims) (zoneStatus, bool) {
	tier := z.tierValue(r, repl, claims)
	key, ok := z.key.evaluate(r, repl, claims)
	// As Handler.match: the key, its override, tier or zone, on the
	// handler's clock.
	res := z.resolve(key, ok, tier, r, time.Time{})
	l, state := res.limit, res.state
	switch res.verdict {
	case verdictSkip, verdictDeny, verdictExempt:
		// No key, or an exempt one: the zone reports nothing of it.
		return zoneStatus{}, false
	case verdictBlock:
		return zoneStatus{Zone: z.name, Reset: ceilSeconds(res.wait), Window: ceilSeconds(l.window)}, true
	}
	d, err := l.store.Peek(r.Context(), state)
	if err != nil && z.fail == failLocal && l.fallback != nil {
		// What decides the client's requests while the store fails.
		d, err = l.fallback.Peek(r.Context(), state)
	}
	if err != nil {
		s.logger.Debug("rate_limit_status leaves out a zone whose store failed", zap.String("zone", z.name), zap.Error(err))
		return zoneStatus{}, false
	}
	q, _ := l.policy.Quota()
	return zoneStatus{
		Zone:      z.name,
		Limit:     q,
		Remaining: d.Remaining,
		Reset:     ceilSeconds(d.ResetAfter),
		Window:    max(1, ceilSeconds(l.windowAt(d.At()))),
	}, true
}

// warnUnknownNames logs the names in Zones that no rate_limit of the
// handler's config declares: most likely a typo, which would otherwise
// only show as a zone missing from every answer.
func (s *StatusHandler) warnUnknownNames() {
	for _, name := range s.Zones {
		known := slices.ContainsFunc(zones.named(name), func(reg registered) bool { return reg.config == s.config })
		if !known {
			s.logger.Warn("rate_limit_status names a zone that no rate_limit of this config declares; it is left out of every answer", zap.String("zone", name))
		}
	}
}

// Interface guards
var (
	_ caddy.Module                = (*StatusHandler)(nil)
	_ caddy.Provisioner           = (*StatusHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*StatusHandler)(nil)
)

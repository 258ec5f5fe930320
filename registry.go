package ratelimit

import (
	"slices"
	"sync"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwtauth"
)

// zones is every zone of the handlers provisioned and not yet cleaned up,
// by name, for the admin API and the gauges that describe zones. Two
// handlers may declare one name; each of their zones is listed, so the
// admin API answers for all of them, never for one silently.
var zones = &zoneRegistry{byName: map[string][]registered{}}

// registered is a zone with the settings of its handler that the admin API
// and rate_limit_status need.
type registered struct {
	zone   *zone
	logKey bool
	// metrics is false when the handler disabled its metrics.
	metrics bool
	// jwt is the handler's verifier, nil without a jwt block:
	// rate_limit_status reads a client's claims as the zone's own handler
	// does.
	jwt *jwtauth.Verifier
	// config identifies the config the handler was loaded with (its
	// context's Done channel, one per config load), so rate_limit_status
	// answers from its own config while a replaced one is still draining.
	config <-chan struct{}
}

type zoneRegistry struct {
	mu     sync.RWMutex
	byName map[string][]registered
}

// add lists h's zones, loaded with the config whose context's Done
// channel is config.
func (reg *zoneRegistry) add(h *Handler, config <-chan struct{}) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for _, z := range h.zones {
		reg.byName[z.name] = append(reg.byName[z.name], registered{zone: z, logKey: h.LogKey, metrics: !h.DisableMetrics, jwt: h.jwt, config: config})
	}
}

// remove forgets h's zones, and the metric series of a name no zone has
// any more.
func (reg *zoneRegistry) remove(h *Handler) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for _, z := range h.zones {
		list := slices.DeleteFunc(reg.byName[z.name], func(r registered) bool { return r.zone == z })
		if len(list) == 0 {
			delete(reg.byName, z.name)
			metricFamilies.forgetZone(z.name)
		} else {
			reg.byName[z.name] = list
		}
	}
}

// named lists the zones called name, in the order their handlers were
// provisioned.
func (reg *zoneRegistry) named(name string) []registered {
	reg.mu.RLock()
	defer reg.mu.RUnlock()
	return slices.Clone(reg.byName[name])
}

// all lists every zone, by name and then in the order their handlers were
// provisioned.
func (reg *zoneRegistry) all() []registered {
	reg.mu.RLock()
	defer reg.mu.RUnlock()
	names := make([]string, 0, len(reg.byName))
	for name := range reg.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []registered
	for _, name := range names {
		out = append(out, reg.byName[name]...)
	}
	return out
}

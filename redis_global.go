package ratelimit

import (
	"errors"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// GlobalRedisConfig is the redis block's `global` block: the server that
// holds each key's true count when instances in several regions share one
// limit (see docs/design.md, "Regions"). The redis block's own server is
// then the region's: it keeps the units the region took from global, and
// the region's instances decide against it; one of them asks global for
// more only when the region's units of a key run short.
type GlobalRedisConfig struct {
	// The global server's settings, as the redis block's: url or
	// addresses (Cluster, Sentinel with master_name) or shards,
	// credentials, tls, key_prefix, breaker... Timeout bounds each call to
	// global, which only a refill or a return of units makes; default 1s,
	// since a server in another region is tens of milliseconds away (the
	// redis block's 5ms default would fail every refill). Neither global
	// nor overrides_refresh applies: runtime overrides are kept in each
	// region's Redis.
	RedisConfig

	// RegionQuota is the most of a key's quota one region holds at once,
	// a fraction above 0 and at most 1. A region refills a key's units in
	// batches that start at a request's cost and double while they run
	// out within their lifetime (1s), up to this share. Default: 0.1.
	// Units a region holds are not available to the others: with R
	// regions, a key may be refused while the others hold up to
	// (R-1) × region_quota of its quota, until their units lapse back.
	RegionQuota float64 `json:"region_quota,omitempty"`
}

// defaultRegionQuota is region_quota when none is given: ten regions can
// each hold a batch of a key at once.
const defaultRegionQuota = 0.1

// defaultGlobalTimeout bounds a call to the global server when its block
// sets no timeout: room for a round trip between continents (100-300 ms)
// and a slow moment. Only refills and returns wait for global; decisions
// from the region's units never do.
const defaultGlobalTimeout = time.Second

var regionQuotaBound = fractionBound{name: "region_quota", hi: 1, openLow: true,
	explain: "a fraction of the quota above 0 and at most 1, such as 0.25"}

// regionQuota is RegionQuota, or its default.
func (g *GlobalRedisConfig) regionQuota() float64 {
	if g.RegionQuota == 0 {
		return defaultRegionQuota
	}
	return g.RegionQuota
}

// timeout is the bound of a call to global.
func (g *GlobalRedisConfig) timeout() time.Duration {
	if g.Timeout == 0 {
		return defaultGlobalTimeout
	}
	return time.Duration(g.Timeout)
}

// validate refuses a global block that names no server, holds an option
// that does not apply to it, or a region_quota outside (0, 1]; the server
// settings are checked as the redis block's. A region_quota of 0 is the
// default (JSON leaves it out).
func (g *GlobalRedisConfig) validate() error {
	if g.URL == "" && len(g.Addresses) == 0 && len(g.Shards) == 0 {
		return errors.New("a global block needs the global server's url (or addresses or shards)")
	}
	if g.Global != nil {
		return errors.New("a global block cannot hold another")
	}
	if g.OverridesRefresh != 0 {
		return errors.New("overrides_refresh does not apply to global: runtime overrides are kept in each region's Redis")
	}
	if g.RegionQuota != 0 {
		if err := regionQuotaBound.check(g.RegionQuota); err != nil {
			return err
		}
	}
	return g.RedisConfig.validate()
}

// parse reads `global { ... }` with the dispenser on `global`, and checks
// the block when it closes, at its line.
func (g *GlobalRedisConfig) parse(d *caddyfile.Dispenser) error {
	line := d.Line()
	if d.NextArg() {
		return errArgCount
	}
	const block = "redis: global"
	opts := g.RedisConfig.options(block)
	delete(opts, "overrides_refresh")
	opts["region_quota"] = fractionOption(&g.RegionQuota, regionQuotaBound)
	if err := parseBlock(d, block, opts); err != nil {
		return err
	}
	if err := g.validate(); err != nil {
		return refuseAt(d, line, "%s: %v", block, err)
	}
	return nil
}

// server names the global server as the zones API shows it: its url
// (resolved, without the password or query options), or its addresses or
// shards, and the Sentinel master's name. It never holds a secret.
func (g *GlobalRedisConfig) server() string {
	c := g.resolved()
	switch {
	case c.URL != "":
		u, _, _ := strings.Cut(c.URL, "?")
		return redactUserinfo(u)
	case len(c.Shards) > 0:
		return "shards " + strings.Join(c.Shards, ",")
	case c.MasterName != "":
		return "sentinel " + c.MasterName + " at " + strings.Join(c.Addresses, ",")
	}
	return strings.Join(c.Addresses, ",")
}

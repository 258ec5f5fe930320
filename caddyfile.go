package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile parses the rate_limit directive; README.md has the
// full syntax. Every error carries the Caddyfile line it refers to.
//
//	rate_limit [<matcher>] {
//		zone <name> {
//			match { <matchers> }
//			key ip | header <name> | jwt_claim <claim> | <template>
//			algorithm <name>
//			events <n>
//			window <duration>
//			rate <n>/<duration>
//			...
//		}
//		headers both | x-ratelimit | ietf | none
//		...
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	zoneLines := map[string]int{}
	err := eachOption(d, "", "zone", func(opt string) error {
		var err error
		switch opt {
		case "zone":
			err = h.parseZone(d, zoneLines)
		case "redis":
			h.Redis = new(RedisConfig)
			err = h.Redis.UnmarshalCaddyfile(d)
		case "jwt":
			h.JWT = new(JWTConfig)
			err = h.JWT.UnmarshalCaddyfile(d)
		case "headers":
			err = parseStringArg(d, &h.Headers)
			if err == nil {
				if _, perr := parseHeaderMode(h.Headers); perr != nil {
					err = d.Err(perr.Error())
				}
			}
		case "log_key":
			h.LogKey, err = true, noArgs(d)
		case "disable_metrics":
			h.DisableMetrics, err = true, noArgs(d)
		case "sweep_interval":
			err = parseDurationArg(d, &h.SweepInterval)
		case "max_keys":
			err = parsePositiveIntArg(d, &h.MaxKeys)
		case "log_sample":
			err = parseFraction(d, &h.LogSample)
		case "jitter":
			err = parseFraction(d, &h.Jitter)
		case "distributed":
			h.Distributed, err = skipCompatBlock(d)
		case "storage":
			h.StorageRaw, err = skipCompatBlock(d)
		default:
			return d.Errf("unknown rate_limit option %q", opt)
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(h.RateLimits) == 0 {
		return d.Err("rate_limit needs at least one zone")
	}
	// Checks that span blocks, reported at the zone's line.
	for name, z := range h.RateLimits {
		if z.Store == storeRedis && h.Redis == nil {
			return zoneError(d, zoneLines[name], name, errors.New("store redis needs a redis block in this rate_limit"))
		}
		if z.usesJWTClaimKey && h.JWT == nil {
			return zoneError(d, zoneLines[name], name, errors.New("key jwt_claim needs a jwt block in this rate_limit"))
		}
	}
	return nil
}

// parseZone parses `zone <name> { ... }`.
func (h *Handler) parseZone(d *caddyfile.Dispenser, lines map[string]int) error {
	line := d.Line()
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := h.RateLimits[name]; dup {
		return d.Errf("zone %q defined twice", name)
	}
	z := new(Zone)
	usedRate, usedEventsOrWindow := false, false
	err := eachOption(d, fmt.Sprintf("zone %q: ", name), "match", func(opt string) error {
		var err error
		switch opt {
		case "match":
			set, merr := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if merr != nil {
				return merr
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		case "key":
			err = parseKey(d, z)
		case "algorithm":
			err = parseStringArg(d, &z.Algorithm)
		case "events":
			if usedRate {
				return d.Errf("zone %q: rate and events cannot both be set", name)
			}
			usedEventsOrWindow = true
			err = parsePositiveArg(d, &z.MaxEvents)
		case "window":
			if usedRate {
				return d.Errf("zone %q: rate and window cannot both be set", name)
			}
			usedEventsOrWindow = true
			err = parseDurationArg(d, &z.Window)
		case "rate":
			if usedEventsOrWindow {
				return d.Errf("zone %q: rate and events/window cannot both be set", name)
			}
			usedRate = true
			err = parseRate(d, z)
		case "burst":
			err = parsePositiveArg(d, &z.Burst)
		case "cost":
			err = parsePositiveArg(d, &z.Cost)
		case "max_delay":
			var md caddy.Duration
			if err = parseDurationArg(d, &md); err == nil {
				if md < 0 {
					return d.Errf("zone %q: max_delay must not be negative", name)
				}
				z.MaxDelay = &md
			}
		case "store":
			err = parseStringArg(d, &z.Store)
		case "fail":
			err = parseStringArg(d, &z.Fail)
		case "tier":
			err = parseTier(d, z)
		case "missing_key":
			err = parseStringArg(d, &z.MissingKey)
		case "ipv4_prefix":
			err = parseIntArg(d, &z.IPv4Prefix, 1, 32)
		case "ipv6_prefix":
			err = parseIntArg(d, &z.IPv6Prefix, 1, 128)
		case "dry_run":
			z.DryRun, err = true, noArgs(d)
		case "local_quota":
			err = parseFraction(d, &z.LocalQuota)
		case "deny_cache":
			err = parseDenyCache(d, z)
		default:
			return d.Errf("zone %q: unknown option %q", name, opt)
		}
		if err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := z.validate(name); err != nil {
		return zoneError(d, line, name, err)
	}
	if h.RateLimits == nil {
		h.RateLimits = make(map[string]*Zone)
	}
	h.RateLimits[name] = z
	lines[name] = line
	return nil
}

// parseTier reads `tier <placeholder> { <value> <n>/<duration> ... }`.
func parseTier(d *caddyfile.Dispenser, z *Zone) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	t := &Tier{Placeholder: d.Val(), Limits: map[string]TierLimit{}}
	if _, err := parseKeyTemplate(t.Placeholder); err != nil || !strings.Contains(t.Placeholder, "{") {
		return d.Errf("tier: %q is not a placeholder such as {plan} or {jwt.plan}", t.Placeholder)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		value := d.Val()
		if _, dup := t.Limits[value]; dup {
			return d.Errf("tier: value %q listed twice", value)
		}
		var tz Zone
		if err := parseRate(d, &tz); err != nil {
			return err
		}
		t.Limits[value] = TierLimit{MaxEvents: tz.MaxEvents, Window: tz.Window}
	}
	if len(t.Limits) == 0 {
		return d.Err("tier: list at least one <value> <n>/<duration>")
	}
	z.Tier = t
	return nil
}

// zoneError reports a problem found once a zone's block is complete at the
// line of its `zone` token, in the form the Dispenser's errors take.
func zoneError(d *caddyfile.Dispenser, line int, name string, err error) error {
	return fmt.Errorf("zone %q: %v, at %s:%d", name, err, d.File(), line)
}

// parseKey reads `key ip | header <name> | <template>`.
func parseKey(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && args[0] == "ip":
		z.Key = "{" + clientIPPlaceholder + "}"
	case len(args) == 2 && args[0] == "jwt_claim":
		if strings.ContainsAny(args[1], "{} ") || args[1] == "" {
			return d.Errf("claim name %q is not valid", args[1])
		}
		z.Key = "{jwt." + args[1] + "}"
		z.usesJWTClaimKey = true
	case len(args) == 2 && args[0] == "header":
		if strings.ContainsAny(args[1], "{} ") {
			return d.Errf("header name %q is not valid", args[1])
		}
		z.Key = "{http.request.header." + args[1] + "}"
	case len(args) == 1:
		z.Key = args[0]
	default:
		return d.ArgErr()
	}
	if _, err := parseKeyTemplate(z.Key); err != nil {
		return d.Errf("key: %v", err)
	}
	return nil
}

// parseRate reads `rate <n>/<duration>`: 100/1m, 10/30s, or a bare unit
// meaning one of it: 5/s, 1000/h, 10000/d.
func parseRate(d *caddyfile.Dispenser, z *Zone) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	n, per, ok := strings.Cut(d.Val(), "/")
	if !ok {
		return d.Errf("rate %q: want <events>/<duration>, like 100/1m or 5/s", d.Val())
	}
	events, err := strconv.ParseInt(n, 10, 64)
	if err != nil || events <= 0 {
		return d.Errf("rate %q: events must be a positive integer", d.Val())
	}
	window, err := parseRateWindow(per)
	if err != nil || window <= 0 {
		return d.Errf("rate %q: window must be a positive duration like 1m, 30s, s, h or d", d.Val())
	}
	if err := windowBound.check(caddy.Duration(window)); err != nil {
		return d.Errf("rate %q: %v", d.Val(), err)
	}
	z.MaxEvents, z.Window = events, caddy.Duration(window)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func parseRateWindow(s string) (time.Duration, error) {
	switch s {
	case "ms", "s", "m", "h", "d":
		s = "1" + s
	}
	return caddy.ParseDuration(s)
}

// eachOption calls parse with the name of every option in the block the
// dispenser is about to open, the dispenser on that name, so every block
// of the directive (rate_limit, zone, redis) refuses an option given twice
// the same way, at the line of the second: prefix names the block in the
// error, and repeatable is the one option that may recur (a rate_limit's
// zones, a zone's matchers), or "".
func eachOption(d *caddyfile.Dispenser, prefix, repeatable string, parse func(opt string) error) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != repeatable {
			if seen[opt] {
				return d.Errf("%s%s specified twice", prefix, opt)
			}
			seen[opt] = true
		}
		if err := parse(opt); err != nil {
			return err
		}
	}
	return nil
}

// optionArg binds an argument parser to the field it fills, so a table of
// options can name each option's parser in one line.
func optionArg[T any](parse func(*caddyfile.Dispenser, *T) error, dst *T) func(*caddyfile.Dispenser) error {
	return func(d *caddyfile.Dispenser) error { return parse(d, dst) }
}

func noArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

func parseStringArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	return noArgs(d)
}

func parsePositiveArg(d *caddyfile.Dispenser, dst *int64) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	n, err := strconv.ParseInt(d.Val(), 10, 64)
	if err != nil || n <= 0 {
		return d.Errf("%s: want a positive integer, got %q", opt, d.Val())
	}
	*dst = n
	return noArgs(d)
}

// parsePositiveIntArg is parsePositiveArg for the int fields (max_keys,
// pool_size) that size things in memory.
func parsePositiveIntArg(d *caddyfile.Dispenser, dst *int) error {
	opt := d.Val()
	var n int64
	if err := parsePositiveArg(d, &n); err != nil {
		return err
	}
	if n > maxCount {
		return d.Errf("%s: %d is more than this option allows (%d)", opt, n, maxCount)
	}
	*dst = int(n)
	return nil
}

func parseIntArg(d *caddyfile.Dispenser, dst *int, lo, hi int) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < lo || n > hi {
		return d.Errf("%s: want an integer from %d to %d, got %q", opt, lo, hi, d.Val())
	}
	*dst = n
	return noArgs(d)
}

func parseDurationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	v, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return d.Errf("%s: invalid duration %q: %v", opt, d.Val(), err)
	}
	if v <= 0 && opt != "max_delay" {
		return d.Errf("%s: must be positive, got %q", opt, d.Val())
	}
	if b, ok := durationBounds[opt]; ok {
		if err := b.check(caddy.Duration(v)); err != nil {
			return d.Err(err.Error())
		}
	}
	*dst = caddy.Duration(v)
	return noArgs(d)
}

// parseDenyCache reads `deny_cache <duration> | off`.
func parseDenyCache(d *caddyfile.Dispenser, z *Zone) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	var v time.Duration
	if d.Val() != "off" {
		var err error
		if v, err = caddy.ParseDuration(d.Val()); err != nil || v <= 0 {
			return d.Errf("deny_cache: want a positive duration or off, got %q", d.Val())
		}
		if err := denyCacheBound.check(caddy.Duration(v)); err != nil {
			return d.Err(err.Error())
		}
	}
	dc := caddy.Duration(v)
	z.DenyCache = &dc
	return noArgs(d)
}

// parseFraction reads a fraction option (jitter, log_sample, local_quota)
// and checks it with the option's bound (bounds.go), which Validate uses
// too: NaN and infinities are refused, at the option's line.
func parseFraction(d *caddyfile.Dispenser, dst *float64) error {
	opt := d.Val()
	b := fractionBounds[opt]
	if !d.NextArg() {
		return d.ArgErr()
	}
	v, err := strconv.ParseFloat(d.Val(), 64)
	if err != nil || b.check(v) != nil {
		return d.Errf("%s: want %s, got %q", opt, b.explain, d.Val())
	}
	*dst = v
	return noArgs(d)
}

// skipCompatBlock accepts an option of mholt/caddy-ratelimit that Floodgate
// does not use (distributed, storage): its arguments and block are
// consumed and recorded as JSON so `caddy adapt` keeps them visible.
func skipCompatBlock(d *caddyfile.Dispenser) (json.RawMessage, error) {
	opts := map[string][]string{}
	if args := d.RemainingArgs(); len(args) > 0 {
		opts["module"] = args
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		opts[key] = append(opts[key], d.RemainingArgs()...)
		for sub := d.Nesting(); d.NextBlock(sub); {
		}
	}
	raw, err := json.Marshal(opts)
	if err != nil {
		return nil, d.Errf("encoding %s: %v", d.Val(), err)
	}
	return raw, nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)

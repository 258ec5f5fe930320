package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
	httpcaddyfile.RegisterHandlerDirective("rate_limit_status", parseStatusCaddyfile)
	// It answers, as respond does: after rate_limit and the directives that
	// authenticate (basic_auth, forward_auth), which can then guard it,
	// and after handle and route, so it can stand inside either.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_status", httpcaddyfile.Before, "respond")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

func parseStatusCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler StatusHandler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile parses the rate_limit_status directive, which takes
// zone names and no block (an empty one is accepted):
//
//	rate_limit_status [<matcher>] [<zone>...]
func (s *StatusHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	line := d.Line()
	s.Zones = d.RemainingArgs()
	if err := parseBlock(d, "rate_limit_status", nil); err != nil {
		return err
	}
	if err := s.validate(); err != nil {
		return refuseAt(d, line, "rate_limit_status: %v", err)
	}
	return nil
}

// UnmarshalCaddyfile parses the rate_limit directive; docs/reference.md has
// the full syntax. Every error carries the Caddyfile line it refers to.
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
//		headers <family>... | none
//		...
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	line := d.Line()
	if d.NextArg() {
		return refuse(d, "rate_limit takes [<matcher>] %s", blockArgs)
	}
	zoneLines := map[string]int{}
	if err := parseBlock(d, "rate_limit", h.options(zoneLines)); err != nil {
		return err
	}
	if len(h.RateLimits) == 0 {
		return refuseAt(d, line, "rate_limit: %v", errNoZone)
	}
	// Checks that span blocks, reported at the zone's line.
	for _, name := range h.zoneNames() {
		z := h.RateLimits[name]
		err := h.zoneNeeds(z)
		if err == nil && z.usesJWTClaimKey && h.JWT == nil {
			err = errors.New("key jwt_claim needs a jwt block in this rate_limit")
		}
		if err != nil {
			return refuseAt(d, zoneLines[name], "%s: %v", zoneBlock(name), err)
		}
	}
	return nil
}

// options is the rate_limit block's option table; zoneLines records the
// line of each zone, for the checks made once the whole block is read.
func (h *Handler) options(zoneLines map[string]int) map[string]option {
	return map[string]option{
		"zone": {args: "<name> " + blockArgs, repeats: true, parse: func(d *caddyfile.Dispenser) error {
			return h.parseZone(d, zoneLines)
		}},
		"redis": {args: blockArgs, parse: func(d *caddyfile.Dispenser) error {
			h.Redis = new(RedisConfig)
			return h.Redis.UnmarshalCaddyfile(d)
		}},
		"jwt": {args: blockArgs, parse: func(d *caddyfile.Dispenser) error {
			h.JWT = new(JWTConfig)
			return h.JWT.UnmarshalCaddyfile(d)
		}},
		"headers": {args: "<family>... (x-ratelimit, ietf, draft-7, draft-6; or none)", parse: func(d *caddyfile.Dispenser) error {
			names := d.RemainingArgs()
			if len(names) == 0 {
				return errArgCount
			}
			if _, err := parseHeaderFamilies(names); err != nil {
				return err
			}
			h.Headers = names
			return nil
		}},
		"log_key":         flagOption(&h.LogKey),
		"key_secret":      stringOption("<secret>", &h.KeySecret),
		"disable_metrics": flagOption(&h.DisableMetrics),
		"sweep_interval":  durationOption(&h.SweepInterval, sweepIntervalBound),
		"max_keys":        intOption(&h.MaxKeys, maxKeysBound),
		"log_sample":      fractionOption(&h.LogSample, logSampleBound),
		"jitter":          fractionOption(&h.Jitter, jitterBound),
		"distributed":     compatOption(&h.Distributed),
		"storage":         compatOption(&h.StorageRaw),
	}
}

// errNoZone refuses a rate_limit without zones, in the Caddyfile and in
// JSON alike.
var errNoZone = errors.New("at least one zone is required")

// zoneBlock is how refusals name a zone's block: as the Caddyfile
// writes it.
func zoneBlock(name string) string { return "zone " + name }

// parseZone parses `zone <name> { ... }` and checks the zone when its
// block closes, reporting that check's refusal at the zone's line.
func (h *Handler) parseZone(d *caddyfile.Dispenser, lines map[string]int) error {
	line := d.Line()
	name, err := oneArg(d)
	if err != nil {
		return err
	}
	if _, dup := h.RateLimits[name]; dup {
		return refuse(d, "rate_limit: zone '%s' specified twice", name)
	}
	z := new(Zone)
	block := zoneBlock(name)
	if err := parseBlock(d, block, z.options(block)); err != nil {
		return err
	}
	if err := z.validate(name); err != nil {
		return refuseAt(d, line, "%s: %v", block, err)
	}
	if h.RateLimits == nil {
		h.RateLimits = make(map[string]*Zone)
	}
	h.RateLimits[name] = z
	lines[name] = line
	return nil
}

// exclusive makes o refuse to parse, saying why, once an option it cannot
// be used with has (*other set), and note that it has been used (*used).
func exclusive(o option, other, used *bool, why string) option {
	parse := o.parse
	o.parse = func(d *caddyfile.Dispenser) error {
		if *other {
			return errors.New(why)
		}
		*used = true
		return parse(d)
	}
	return o
}

// options is a zone block's option table; block names the zone in the
// refusals of its matchers, whose parser words its own.
func (z *Zone) options(block string) map[string]option {
	rate, eventsOrWindow, window, calendar := false, false, false, false
	// The shorthand rate and the pair events and window set the same
	// fields: a zone uses one or the other.
	notWithRate := func(o option) option {
		return exclusive(o, &rate, &eventsOrWindow, "cannot be used together with rate")
	}
	// A calendar is the zone's window: not with window, nor with rate,
	// which sets one.
	notWithCalendar := func(o option) option {
		return exclusive(o, &calendar, &window, "cannot be used together with calendar, which sets the zone's windows")
	}
	return map[string]option{
		"match": {args: "{ <matchers> }", repeats: true, parse: func(d *caddyfile.Dispenser) error {
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return placed(fmt.Errorf("%s: option 'match': %w", block, err))
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
			return nil
		}},
		"key":       {args: "ip | header <name> | jwt_claim <claim> | <template>", parse: z.parseKey},
		"algorithm": stringOption("<name>", &z.Algorithm),
		"events":    notWithRate(positiveOption(&z.MaxEvents)),
		"window":    notWithCalendar(notWithRate(durationOption(&z.Window, windowBound))),
		"calendar": {args: "day | week | month [<time zone>]", parse: func(d *caddyfile.Dispenser) error {
			if err := z.parseCalendar(d); err != nil {
				return err
			}
			if window {
				return errors.New("cannot be used together with window or rate: the calendar sets the zone's windows")
			}
			calendar = true
			return nil
		}},
		"rate": notWithCalendar(option{args: "<n>/<duration>", parse: func(d *caddyfile.Dispenser) error {
			if eventsOrWindow {
				return errors.New("cannot be used together with events or window")
			}
			rate = true
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			z.MaxEvents, z.Window, err = parseRate(v)
			return err
		}}),
		"burst": positiveOption(&z.Burst),
		"cost": {args: "<n> | <placeholder>", parse: func(d *caddyfile.Dispenser) error {
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			c := Cost(v)
			if !c.isTemplate() {
				if n, err := strconv.ParseInt(v, 10, 64); err != nil || n <= 0 {
					return fmt.Errorf("want a positive integer or a placeholder, got %q", v)
				}
			} else if _, err := c.template(); err != nil {
				return err
			}
			z.Cost = c
			return nil
		}},
		"count_response": {args: blockArgs, parse: func(d *caddyfile.Dispenser) error {
			return z.parseCountResponse(d, block+": count_response")
		}},
		"response_cost": {args: "<header> [keep]", parse: func(d *caddyfile.Dispenser) error {
			args := d.RemainingArgs()
			if len(args) == 0 || len(args) > 2 || (len(args) == 2 && args[1] != "keep") {
				return errArgCount
			}
			rc := &ResponseCost{Header: args[0], Keep: len(args) == 2}
			if err := rc.validate(); err != nil {
				return err
			}
			z.ResponseCost = rc
			return nil
		}},
		"max_delay": {args: "<duration>", parse: func(d *caddyfile.Dispenser) error {
			z.MaxDelay = new(caddy.Duration)
			return durationOption(z.MaxDelay, maxDelayBound).parse(d)
		}},
		"store":       stringOption("memory | redis", &z.Store),
		"fail":        stringOption("open | closed | local", &z.Fail),
		"tier":        {args: "<placeholder> { <value> <n>/<duration | period> ... }", parse: z.parseTier},
		"missing_key": stringOption("ip | deny | skip", &z.MissingKey),
		"ipv4_prefix": intOption(&z.IPv4Prefix, ipv4PrefixBound),
		"ipv6_prefix": intOption(&z.IPv6Prefix, ipv6PrefixBound),
		"dry_run":     flagOption(&z.DryRun),
		"exceeded":    stringOption("refuse | pass", &z.Exceeded),
		"local_quota": fractionOption(&z.LocalQuota, localQuotaBound),
		"deny_cache": {args: "<duration> | off", parse: func(d *caddyfile.Dispenser) error {
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			dc := caddy.Duration(0)
			if v != "off" {
				if dc, err = parseDuration(v, denyCacheBound, false); err != nil {
					return err
				}
			}
			z.DenyCache = &dc
			return nil
		}},
	}
}

// parseCalendar reads `calendar day | week | month [<time zone>]`.
func (z *Zone) parseCalendar(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return errArgCount
	}
	c := &CalendarConfig{Period: args[0]}
	if len(args) == 2 {
		c.TimeZone = args[1]
	}
	if err := c.validate(); err != nil {
		return err
	}
	z.Calendar = c
	return nil
}

// parseCountResponse reads `count_response { status <code|Nxx>...;
// header <field> [<value>] }` into Caddy's response matcher: a header
// without a value must be present, `!<field>` absent. block names it in
// refusals.
func (z *Zone) parseCountResponse(d *caddyfile.Dispenser, block string) error {
	if d.NextArg() {
		return errArgCount
	}
	m := new(caddyhttp.ResponseMatcher)
	err := parseBlock(d, block, map[string]option{
		"status": {args: "<code|Nxx>...", repeats: true, parse: func(d *caddyfile.Dispenser) error {
			args := d.RemainingArgs()
			if len(args) == 0 {
				return errArgCount
			}
			for _, a := range args {
				code, err := parseStatus(a)
				if err != nil {
					return err
				}
				m.StatusCode = append(m.StatusCode, code)
			}
			return nil
		}},
		"header": {args: "<field> [<value>]", repeats: true, parse: func(d *caddyfile.Dispenser) error {
			args := d.RemainingArgs()
			if len(args) == 0 || len(args) > 2 {
				return errArgCount
			}
			if m.Headers == nil {
				m.Headers = http.Header{}
			}
			field, absent := strings.CutPrefix(args[0], "!")
			field = http.CanonicalHeaderKey(field)
			switch {
			case field == "":
				return fmt.Errorf("%q is not a header field name", args[0])
			case absent && len(args) == 2:
				return fmt.Errorf("!%s matches a missing header, which has no value", field)
			case absent:
				m.Headers[field] = nil
			case len(args) == 1:
				if m.Headers[field] == nil {
					m.Headers[field] = []string{} // present, any value
				}
			default:
				m.Headers[field] = append(m.Headers[field], args[1])
			}
			return nil
		}},
	})
	if err != nil {
		return err
	}
	if err := validateCountResponse(m); err != nil {
		return err
	}
	z.CountResponse = m
	return nil
}

// parseStatus reads a status code (401) or class (4xx) as Caddy's
// response matcher takes it: a class is its first digit.
func parseStatus(s string) (int, error) {
	if len(s) == 3 && strings.HasSuffix(s, "xx") {
		s = s[:1]
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("status %q is neither a code (401) nor a class (4xx)", s)
	}
	return code, nil
}

// parseTier reads `tier <placeholder> { <value> <n>/<duration> ... }`;
// a calendar zone's tiers are written <n>/day, <n>/week or <n>/month.
func (z *Zone) parseTier(d *caddyfile.Dispenser) error {
	placeholder, err := oneArg(d)
	if err != nil {
		return err
	}
	if _, err := parseTierKey(placeholder); err != nil {
		return err
	}
	t := &Tier{Placeholder: placeholder, Limits: map[string]TierLimit{}}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		value := d.Val()
		if _, dup := t.Limits[value]; dup {
			return fmt.Errorf("value '%s' specified twice", value)
		}
		rate, err := oneArg(d)
		if err != nil {
			return fmt.Errorf("value '%s' takes <n>/<duration>", value)
		}
		tl, err := parseTierRate(rate)
		if err != nil {
			return fmt.Errorf("value '%s': %w", value, err)
		}
		t.Limits[value] = tl
	}
	if len(t.Limits) == 0 {
		return errNoTierValue
	}
	z.Tier = t
	return nil
}

// parseKey reads `key ip | header <name> | jwt_claim <claim> | <template>`.
func (z *Zone) parseKey(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	var key string
	switch {
	case len(args) == 1 && args[0] == "ip":
		key = "{" + clientIPPlaceholder + "}"
	case len(args) == 2 && args[0] == "jwt_claim":
		if strings.ContainsAny(args[1], "{} ") || args[1] == "" {
			return fmt.Errorf("claim name %q is not valid", args[1])
		}
		key = "{jwt." + args[1] + "}"
		z.usesJWTClaimKey = true
	case len(args) == 2 && args[0] == "header":
		if strings.ContainsAny(args[1], "{} ") {
			return fmt.Errorf("header name %q is not valid", args[1])
		}
		key = "{http.request.header." + args[1] + "}"
	case len(args) == 1:
		key = args[0]
	default:
		return errArgCount
	}
	if _, err := parseKeyTemplate(key); err != nil {
		return err
	}
	z.Key = key
	return nil
}

// parseRate reads <n>/<duration>: 100/1m, 10/30s, or a bare unit meaning
// one of it: 5/s, 1000/h, 10000/d.
func parseRate(v string) (int64, caddy.Duration, error) {
	n, per, ok := strings.Cut(v, "/")
	if !ok {
		return 0, 0, fmt.Errorf("want <events>/<duration>, like 100/1m or 5/s, got %q", v)
	}
	events, err := parseEvents(n, v)
	if err != nil {
		return 0, 0, err
	}
	window, err := parseRateWindow(per)
	if err != nil || window <= 0 {
		return 0, 0, fmt.Errorf("window must be a positive duration like 1m, 30s, s, h or d, got %q", v)
	}
	if err := windowBound.check(caddy.Duration(window)); err != nil {
		return 0, 0, err
	}
	return events, caddy.Duration(window), nil
}

// parseEvents reads the <n> of rate v.
func parseEvents(n, v string) (int64, error) {
	events, err := strconv.ParseInt(n, 10, 64)
	if err != nil || events <= 0 {
		return 0, fmt.Errorf("events must be a positive integer, got %q", v)
	}
	return events, nil
}

// parseTierRate reads a tier's <n>/<duration>, or its <n>/day, <n>/week
// or <n>/month (a calendar zone's).
func parseTierRate(v string) (TierLimit, error) {
	if n, per, ok := strings.Cut(v, "/"); ok && validPeriod(per) == nil {
		events, err := parseEvents(n, v)
		return TierLimit{MaxEvents: events, Period: per}, err
	}
	var tl TierLimit
	var err error
	tl.MaxEvents, tl.Window, err = parseRate(v)
	return tl, err
}

func parseRateWindow(s string) (time.Duration, error) {
	switch s {
	case "ms", "s", "m", "h", "d":
		s = "1" + s
	}
	return caddy.ParseDuration(s)
}

// An option is one option of a Caddyfile block, in the table its block's
// parser hands to parseBlock. Every block of the directive (rate_limit,
// zone, redis, jwt) is parsed this way, so each kind of refusal reads the
// same in all of them:
//
//	zone api: unknown option 'bogus', at Caddyfile:7
//	zone api: option 'burst' specified twice, at Caddyfile:8
//	zone api: option 'burst' takes <n>, at Caddyfile:8
//	zone api: option 'burst': want a positive integer, got "0", at Caddyfile:8
//
// and a block's own check, made when it closes, is reported at the line
// that opens it: "zone api: burst applies only to ..., at Caddyfile:3".
type option struct {
	// args is what the option takes, as docs/reference.md writes it; "" is
	// nothing. A wrong count of arguments is refused with it.
	args string
	// parse reads the option's arguments, and its block if it has one,
	// with the dispenser on the option's name, and fills its field. It
	// returns errArgCount for a wrong count of arguments, a placed error
	// for a refusal already worded with its block and line (a nested
	// block's), or any other error for a bad value, which parseBlock
	// words with the block and the option at the dispenser's line.
	parse func(d *caddyfile.Dispenser) error
	// repeats lets the option be given more than once (a rate_limit's
	// zones, a zone's matchers); any other is refused the second time.
	repeats bool
}

// blockArgs is the args of an option that takes only a block.
const blockArgs = "{ ... }"

// errArgCount is what an option's parser returns when the option has too
// few or too many arguments.
var errArgCount = errors.New("wrong argument count")

// placedError is a refusal already worded with its block and line, which
// the blocks around it pass on as it is.
type placedError struct{ error }

func (e placedError) Unwrap() error { return e.error }

// placed marks err as worded with its block and line.
func placed(err error) error { return placedError{err} }

// refuse is a refusal at the dispenser's line.
func refuse(d *caddyfile.Dispenser, format string, args ...any) error {
	return placed(d.Errf(format, args...))
}

// refuseAt is a refusal at the given line of the dispenser's file, for a
// check made once a block is read, reported at the line that opens it.
func refuseAt(d *caddyfile.Dispenser, line int, format string, args ...any) error {
	return placed(fmt.Errorf("%s, at %s:%d", fmt.Sprintf(format, args...), d.File(), line))
}

// parseBlock reads the block the dispenser is about to open, option by
// option, with options, the block's table: it refuses an option the table
// lacks or one given twice that may not repeat, and words the refusals of
// the options' parsers (see option), naming the block as block.
func parseBlock(d *caddyfile.Dispenser, block string, options map[string]option) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		opt, known := options[name]
		switch {
		case !known:
			return refuse(d, "%s: unknown option '%s'", block, name)
		case seen[name] && !opt.repeats:
			return refuse(d, "%s: option '%s' specified twice", block, name)
		}
		seen[name] = true
		err := opt.parse(d)
		var done placedError
		switch {
		case err == nil:
		case errors.As(err, &done):
			return err
		case errors.Is(err, errArgCount):
			args := opt.args
			if args == "" {
				args = "no arguments"
			}
			return refuse(d, "%s: option '%s' takes %s", block, name, args)
		default:
			return refuse(d, "%s: option '%s': %v", block, name, err)
		}
	}
	return nil
}

// parseOptionBlock parses the block of a rate_limit option that takes a
// block and no argument (redis, jwt), with the dispenser on the option's
// name, and checks the block when it closes, reporting check's refusal at
// the option's line.
func parseOptionBlock(d *caddyfile.Dispenser, block string, options map[string]option, check func() error) error {
	line := d.Line()
	if d.NextArg() {
		return refuse(d, "rate_limit: option '%s' takes %s", block, blockArgs)
	}
	if err := parseBlock(d, block, options); err != nil {
		return err
	}
	if err := check(); err != nil {
		return refuseAt(d, line, "%s: %v", block, err)
	}
	return nil
}

// oneArg reads an option's one argument.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", errArgCount
	}
	v := d.Val()
	return v, noArgs(d)
}

// noArgs refuses any argument left on the option's line.
func noArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return errArgCount
	}
	return nil
}

// flagOption is an option without arguments that sets dst.
func flagOption(dst *bool) option {
	return option{parse: func(d *caddyfile.Dispenser) error {
		*dst = true
		return noArgs(d)
	}}
}

// stringOption is an option of one argument, kept as written in dst; what
// it may be is checked with the rest of its block's struct.
func stringOption(args string, dst *string) option {
	return option{args: args, parse: func(d *caddyfile.Dispenser) error {
		v, err := oneArg(d)
		*dst = v
		return err
	}}
}

// positiveOption is an option of one positive integer.
func positiveOption(dst *int64) option {
	return option{args: "<n>", parse: func(d *caddyfile.Dispenser) error {
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		*dst = n
		return nil
	}}
}

// intOption is an option of one integer within b.
func intOption(dst *int, b intBound) option {
	return option{args: "<n>", parse: func(d *caddyfile.Dispenser) error {
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", v)
		}
		if err := b.refuse(n); err != nil {
			return err
		}
		*dst = n
		return nil
	}}
}

// durationOption is an option of one duration within b; a written 0 is
// refused unless b says it means something.
func durationOption(dst *caddy.Duration, b durationBound) option {
	return option{args: "<duration>", parse: func(d *caddyfile.Dispenser) error {
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		*dst, err = parseDuration(v, b, b.zeroMeans)
		return err
	}}
}

// parseDuration reads a duration within b; zero is refused unless
// zeroOK.
func parseDuration(v string, b durationBound, zeroOK bool) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 250ms, 5s or 1m, got %q", v)
	}
	if dur == 0 && !zeroOK {
		return 0, fmt.Errorf("must be positive, got %q", v)
	}
	if err := b.refuse(caddy.Duration(dur)); err != nil {
		return 0, err
	}
	return caddy.Duration(dur), nil
}

// fractionOption is an option of one number within b: NaN and infinities
// are refused, as b refuses them in JSON.
func fractionOption(dst *float64, b fractionBound) option {
	return option{args: "<number>", parse: func(d *caddyfile.Dispenser) error {
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || b.refuse(f) != nil {
			return fmt.Errorf("want %s, got %q", b.explain, v)
		}
		*dst = f
		return nil
	}}
}

// compatOption accepts an option of mholt/caddy-ratelimit that Floodgate
// does not use (distributed, storage): its arguments and block are
// consumed and recorded as JSON in dst, so `caddy adapt` keeps them
// visible.
func compatOption(dst *json.RawMessage) option {
	return option{args: "[<module>] { ... }", parse: func(d *caddyfile.Dispenser) error {
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
			return fmt.Errorf("encoding it: %w", err)
		}
		*dst = raw
		return nil
	}}
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*StatusHandler)(nil)
)

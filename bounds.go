package ratelimit

import (
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// The ranges of the numeric options, each defined once. The validate of
// the struct that holds a field checks it with its bound, so a JSON config
// is refused as the Caddyfile is; the Caddyfile parser checks the same
// bound, named in the block's option table, to report the option's own
// line. Each bound has two forms of its refusal: check names the field,
// for the structs; refuse does not, for the parser, whose refusal names
// the block and the option around it. docs/reference.md ("What is
// refused") lists the floors.

// fractionBound is the range of a fraction option: a finite number from lo
// to hi (above lo when openLow is set).
type fractionBound struct {
	name    string
	lo, hi  float64
	openLow bool
	// explain says what is wanted, for the error.
	explain string
}

// check refuses v outside the bound, NaN and infinities included.
func (b fractionBound) check(v float64) error {
	return named(b.name, b.refuse(v))
}

// refuse is check's refusal without the field's name.
func (b fractionBound) refuse(v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < b.lo || v > b.hi || (b.openLow && v == b.lo) {
		return fmt.Errorf("must be %s, got %v", b.explain, v)
	}
	return nil
}

// named puts a field's name before a bound's refusal, or is nil.
func named(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %w", name, err)
}

// maxJitter is the largest jitter: at most ten times the wait is added to
// Retry-After (10 = 1000%). mholt/caddy-ratelimit bounds it not at all, so
// the bound is wide enough for any jitter a config for it sensibly has
// (they are fractions such as 0.2), yet keeps Retry-After finite: 1e300
// once overflowed to Retry-After: 1.
const maxJitter = 10.0

var (
	jitterBound = fractionBound{name: "jitter", hi: maxJitter,
		explain: "a fraction of the wait from 0 to 10, such as 0.2"}
	logSampleBound = fractionBound{name: "log_sample", hi: 1,
		explain: "a fraction of decisions from 0 to 1, such as 0.01"}
	localQuotaBound = fractionBound{name: "local_quota", hi: 1, openLow: true,
		explain: "a fraction of the quota above 0 and at most 1, such as 0.1"}
)

// durationBound is the range of a duration option: never negative, and
// when set (not 0) at least floor. Whether 0 is allowed, and what it
// means (a default, or off), is the field's own: a JSON field left out is
// 0, so the structs' checks allow it where a default applies, and the
// Caddyfile parser refuses a written 0 except where it means something.
type durationBound struct {
	name  string
	floor time.Duration
	// zeroMeans is set when a written 0 means something (max_delay 0:
	// no delay), so the Caddyfile parser takes it.
	zeroMeans bool
}

// check refuses a negative v, and a positive one below the floor.
func (b durationBound) check(v caddy.Duration) error {
	return named(b.name, b.refuse(v))
}

// refuse is check's refusal without the field's name.
func (b durationBound) refuse(v caddy.Duration) error {
	switch d := time.Duration(v); {
	case d < 0:
		return fmt.Errorf("must not be negative, got %v", d)
	case d > 0 && d < b.floor:
		return fmt.Errorf("must be at least %v, got %v", b.floor, d)
	}
	return nil
}

// minDuration is the floor of the durations that time requests and Redis:
// anything shorter is a mistake (a JSON number is nanoseconds, so
// "timeout": 5 is 5ns) rather than a setting that could work.
const minDuration = time.Millisecond

// minSweepInterval is the floor of sweep_interval: a sweep walks every key
// of every memory zone, so sweeping more often costs the request path
// more than the memory it frees.
const minSweepInterval = time.Second

var (
	sweepIntervalBound  = durationBound{name: "sweep_interval", floor: minSweepInterval}
	windowBound         = durationBound{name: "window", floor: minDuration}
	maxDelayBound       = durationBound{name: "max_delay", zeroMeans: true}
	denyCacheBound      = durationBound{name: "deny_cache", floor: minDuration}
	timeoutBound        = durationBound{name: "timeout", floor: minDuration}
	dialTimeoutBound    = durationBound{name: "dial_timeout", floor: minDuration}
	breakerAfterBound   = durationBound{name: "breaker_after", floor: minDuration}
	breakerOpenForBound = durationBound{name: "breaker_open_for", floor: minDuration}
	// A refresh reads one field of each zone's overrides from Redis.
	overridesRefreshBound = durationBound{name: "overrides_refresh", floor: 100 * time.Millisecond}
)

// intBound is the range of an integer option: when set (not 0, which a
// JSON field left out is, and means the default) from lo to hi. The
// Caddyfile parser refuses a written 0 unless lo allows it.
type intBound struct {
	name   string
	lo, hi int
}

// check refuses a v that is set and outside the bound.
func (b intBound) check(v int) error {
	if v == 0 {
		return nil
	}
	return named(b.name, b.refuse(v))
}

// refuse is check's refusal without the field's name, for a written v.
func (b intBound) refuse(v int) error {
	if v < b.lo || v > b.hi {
		return fmt.Errorf("must be from %d to %d, got %d", b.lo, b.hi, v)
	}
	return nil
}

// maxCount bounds the options that size things in memory (max_keys,
// pool_size).
const maxCount = math.MaxInt32

var (
	ipv4PrefixBound = intBound{"ipv4_prefix", 1, 32}
	ipv6PrefixBound = intBound{"ipv6_prefix", 1, 128}
	maxKeysBound    = intBound{"max_keys", 1, maxCount}
	poolSizeBound   = intBound{"pool_size", 1, maxCount}
	// dbBound is redisstore.Config.Validate's range of db, which checks
	// it in JSON, for the parser to report at the option's line.
	dbBound = intBound{"db", 0, redisstore.MaxDB}
)

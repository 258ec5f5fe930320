package ratelimit

import (
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The ranges of the numeric options, each defined once. The Validate (or
// validate) of the struct that holds a field checks it with its bound, so
// a JSON config is refused as the Caddyfile is; the Caddyfile parser
// checks the same bound, found by the option's name, to report the
// option's own line. README.md ("Caddyfile reference") lists the floors.

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
	if math.IsNaN(v) || math.IsInf(v, 0) || v < b.lo || v > b.hi || (b.openLow && v == b.lo) {
		return fmt.Errorf("%s must be %s, got %v", b.name, b.explain, v)
	}
	return nil
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

// fractionBounds finds a fraction option's bound by its Caddyfile name.
var fractionBounds = map[string]fractionBound{
	jitterBound.name:     jitterBound,
	logSampleBound.name:  logSampleBound,
	localQuotaBound.name: localQuotaBound,
}

// durationBound is the range of a duration option: never negative, and
// when set (not 0) at least floor. Whether 0 is allowed, and what it
// means (a default, or off), is the field's own: a JSON field left out is
// 0, so the structs' checks allow it where a default applies, and the
// Caddyfile parser refuses a written 0 except where it means something.
type durationBound struct {
	name  string
	floor time.Duration
}

// check refuses a negative v, and a positive one below the floor.
func (b durationBound) check(v caddy.Duration) error {
	switch d := time.Duration(v); {
	case d < 0:
		return fmt.Errorf("%s must not be negative, got %v", b.name, d)
	case d > 0 && d < b.floor:
		return fmt.Errorf("%s must be at least %v, got %v", b.name, b.floor, d)
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
	sweepIntervalBound  = durationBound{"sweep_interval", minSweepInterval}
	windowBound         = durationBound{"window", minDuration}
	maxDelayBound       = durationBound{"max_delay", 0}
	denyCacheBound      = durationBound{"deny_cache", minDuration}
	timeoutBound        = durationBound{"timeout", minDuration}
	dialTimeoutBound    = durationBound{"dial_timeout", minDuration}
	breakerAfterBound   = durationBound{"breaker_after", minDuration}
	breakerOpenForBound = durationBound{"breaker_open_for", minDuration}
)

// durationBounds finds a duration option's bound by its Caddyfile name.
var durationBounds = map[string]durationBound{}

func init() {
	for _, b := range []durationBound{sweepIntervalBound, windowBound, maxDelayBound, denyCacheBound,
		timeoutBound, dialTimeoutBound, breakerAfterBound, breakerOpenForBound} {
		durationBounds[b.name] = b
	}
}

// maxCount bounds the options that size things in memory (max_keys,
// pool_size).
const maxCount = math.MaxInt32

// checkCount refuses a count that is negative or above maxCount.
func checkCount(name string, n int) error {
	switch {
	case n < 0:
		return fmt.Errorf("%s must not be negative, got %d", name, n)
	case n > maxCount:
		return fmt.Errorf("%s: %d is more than this option allows (%d)", name, n, maxCount)
	}
	return nil
}

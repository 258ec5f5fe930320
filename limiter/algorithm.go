package limiter

import (
	"errors"
	"math/bits"
	"strconv"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// Algorithm names a rate-limiting algorithm. The names are the ones operators
// write in a Caddyfile.
type Algorithm string

// The algorithms, with their formulas in docs/design.md.
const (
	// TokenBucket allows bursts of up to Burst units and refills at
	// Events/Window; a new key starts full.
	TokenBucket Algorithm = "token_bucket"
	// LeakyBucket shapes traffic: admitted requests leave 1/r apart and a
	// request may be held up to MaxDelay before it continues.
	LeakyBucket Algorithm = "leaky_bucket"
	// FixedWindow counts units per aligned window of length Window.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindowLog keeps every admission of the last Window: exact, but
	// memory grows with Events.
	SlidingWindowLog Algorithm = "sliding_window_log"
	// SlidingWindowCounter weights the previous window's count by how much
	// of it still overlaps the sliding window: two counters per key.
	SlidingWindowCounter Algorithm = "sliding_window_counter"
	// Concurrency bounds how many requests of one key are in flight.
	Concurrency Algorithm = "concurrency"
)

// Algorithms lists every algorithm in the order the documentation presents them.
var Algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, Concurrency}

// Traits is what code around the stores must know of an algorithm: which
// options apply, how its limit is reported and what happens to a request
// it admits. Callers ask for these rather than compare names, so an
// algorithm is described once, in this file's table.
type Traits struct {
	// Bucket is set for a capacity (Burst, default Events) refilled at
	// Events/Window: `burst` applies, and the quota is reported as that
	// capacity over the time to refill it from empty.
	Bucket bool
	// HoldsRequests is set when an admitted request may have to wait
	// Decision.RetryAfter before it continues; `max_delay` bounds that wait.
	HoldsRequests bool
	// ReleasesOnFinish is set when admitted units are only borrowed: the
	// caller gives them back with Refund when the request finishes.
	ReleasesOnFinish bool
	// DefaultWindow stands for a Window the configuration leaves out;
	// zero means the window is required.
	DefaultWindow time.Duration
	// Leases is set when a NearCache may take units of the limit ahead of
	// requests (Leaser): the admissions of a window or a bucket, not
	// requests held or in flight.
	Leases bool
	// Charges is set when a store can take units past the limit
	// (Charger), for a cost known only after the response: the
	// algorithms whose state can owe, so that time repays the overdraft.
	// A leaky bucket's units are waits already served and a concurrency
	// slot is a request in flight, so neither can owe.
	Charges bool
	// QuotaUnit names the unit of the quota for the IETF RateLimit-Policy
	// field (its qu parameter); empty means the field's default, requests.
	QuotaUnit string
}

// Traits describes a; an unknown algorithm has none.
func (a Algorithm) Traits() Traits {
	if alg := lookupAlgorithm(a); alg != nil {
		return alg.Traits
	}
	return Traits{}
}

// Known reports whether a is one of Algorithms, so configuration can refuse
// a misspelt name before any store sees it.
func (a Algorithm) Known() bool { return lookupAlgorithm(a) != nil }

// algorithm is everything the stores need of one algorithm.
type algorithm struct {
	name Algorithm
	Traits
	// newTables makes a memory store's empty key tables for the
	// algorithm's per-key state type.
	newTables func() memoryTables
	// scripts are the Redis scripts' sources; keySuffix starts the
	// policy part of every Redis key (see policyTag), so algorithms never
	// read each other's state.
	scripts   scripts
	keySuffix string
	// calendarScripts, when set, decide for a policy with a Calendar,
	// whose windows the instance names for the script (see
	// calendar_window.lua); an algorithm without them takes no calendar.
	calendarScripts scripts
	// redisArgs are the policy's arguments to the script, from L and W
	// on (cost and now come first); the bucket scripts take L and W
	// reduced.
	redisArgs func(p *params) []any
	// refundArg is the argument a refund sends after the policy's, to
	// say which admission it gives back; nil sends none.
	refundArg func(taken Receipt) any
	// holdsSlots is set when every admission holds a slot id of its own
	// (passed as the take's extra argument), which its refund names.
	holdsSlots bool
	// logsLeasesAhead is set when the store logs a lease's units a
	// lifetime ahead of its grant (the sliding log), so a unit must not be
	// spent from a lease that was not: see NearCache.Refund.
	logsLeasesAhead bool
	// leaseEndsWithWindow is set when a lease must not outlive the aligned
	// window it was granted in: the counters' units belong to that window,
	// and spent in the next one they would join that window's own L.
	leaseEndsWithWindow bool
	// checkExact refuses policies the script cannot decide exactly in
	// Lua's doubles, beyond the window bound every algorithm has; nil
	// means that bound suffices.
	checkExact func(p *params) error
}

// algorithmTable describes every algorithm; the order is Algorithms'.
var algorithmTable = []*algorithm{
	{
		name:      TokenBucket,
		Traits:    Traits{Bucket: true, Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[tokenBucketState]() },
		scripts:   mustScripts("bucket.lua", "token_bucket.lua", "bucket_save.lua"),
		keySuffix: "tb",
		redisArgs: func(p *params) []any {
			l, w := p.reduced()
			return []any{l, w, p.b, p.maxAhead}
		},
		checkExact: checkBucketExact,
	},
	{
		name:      LeakyBucket,
		Traits:    Traits{Bucket: true, HoldsRequests: true},
		newTables: func() memoryTables { return newShardSet[leakyBucketState]() },
		scripts:   mustScripts("bucket.lua", "leaky_bucket.lua", "bucket_save.lua"),
		keySuffix: "lb",
		redisArgs: func(p *params) []any {
			l, w := p.reduced()
			return []any{l, w, p.maxDelay / gcd(p.l, p.w), p.maxAhead}
		},
		checkExact: checkBucketExact,
	},
	{
		name:                FixedWindow,
		Traits:              Traits{Leases: true, Charges: true},
		newTables:           func() memoryTables { return newShardSet[fixedWindowState]() },
		scripts:             mustScripts("window.lua", "fixed_window.lua", "window_count.lua"),
		calendarScripts:     mustScripts("calendar_window.lua", "window_count.lua"),
		keySuffix:           "fw",
		redisArgs:           windowArgs,
		refundArg:           refundAt,
		leaseEndsWithWindow: true,
	},
	{
		name:      SlidingWindowLog,
		Traits:    Traits{Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[slidingLogState]() },
		scripts:   mustScripts("sliding_window_log.lua"),
		keySuffix: "swl",
		// A lease's units are logged at the end of its lifetime (see
		// slidingLogState.takeUpTo), which the script is told.
		redisArgs:       func(p *params) []any { return []any{p.l, p.w, LeaseLifetime.Microseconds()} },
		refundArg:       refundAt,
		logsLeasesAhead: true,
	},
	{
		name:                SlidingWindowCounter,
		Traits:              Traits{Leases: true, Charges: true},
		newTables:           func() memoryTables { return newShardSet[slidingCounterState]() },
		scripts:             mustScripts("window.lua", "sliding_window_counter.lua"),
		keySuffix:           "swc",
		redisArgs:           windowArgs,
		refundArg:           refundAt,
		leaseEndsWithWindow: true,
		checkExact: func(p *params) error {
			if hi, lo := bits.Mul64(uint64(p.l), uint64(p.w)); hi != 0 || lo > redisExact/4 {
				return errors.New("events times window is too large to decide exactly in Redis")
			}
			return nil
		},
	},
	{
		name:       Concurrency,
		Traits:     Traits{ReleasesOnFinish: true, DefaultWindow: time.Minute, QuotaUnit: "concurrent-requests"},
		newTables:  func() memoryTables { return newShardSet[concurrencyState]() },
		scripts:    mustScripts("concurrency.lua"),
		keySuffix:  "cc",
		redisArgs:  windowArgs,
		refundArg:  func(taken Receipt) any { return taken.Slot },
		holdsSlots: true,
	},
}

func lookupAlgorithm(a Algorithm) *algorithm {
	for _, alg := range algorithmTable {
		if alg.name == a {
			return alg
		}
	}
	return nil
}

// scripts are an algorithm's two Redis scripts: one runs a single
// decision, the other any number in one call (see lua.Batch).
type scripts struct {
	one, batch string
}

// mustScripts joins an algorithm's script parts at start-up. The names are
// this file's constants, not input: a missing part is a build mistake,
// which TestAlgorithmTable reports before anything runs.
func mustScripts(parts ...string) scripts {
	one, err := lua.Script(parts...)
	if err != nil {
		panic(err)
	}
	batch, err := lua.Batch(parts...)
	if err != nil {
		panic(err)
	}
	return scripts{one: one, batch: batch}
}

// windowArgs are the window algorithms' script arguments: none beyond L and W.
func windowArgs(p *params) []any { return []any{p.l, p.w} }

// refundAt names an admission by the time it was counted at, which tells
// the window algorithms which window or log entry to give back to.
func refundAt(taken Receipt) any { return taken.Name() }

// reduced is L and W divided by their greatest common divisor: the bucket
// algorithms compute in time scaled by L, and the reduction changes no
// decision while keeping the products small.
func (p *params) reduced() (l, w int64) {
	g := gcd(p.l, p.w)
	return p.l / g, p.w / g
}

// policyTag names the limit a Redis key's state was written under: the
// algorithm's suffix, L/W (W in µs, or a calendar's period@zone) and, where they differ from their
// defaults, the burst (b) and max_delay (d, µs × L). Two stores of one zone
// name with different limits (two handlers, or a reload that changes the
// limit) therefore never read each other's state, which was written under
// other arithmetic: a fixed window's index under another W, or a bucket's
// tat under another rate. A reload that keeps the policy keeps the names,
// and so the counters.
func (p *params) policyTag() string {
	b := make([]byte, 0, 40)
	b = append(b, p.alg.keySuffix...)
	b = append(b, ':')
	b = strconv.AppendInt(b, p.l, 10)
	b = append(b, '/')
	if p.cal != nil {
		// A calendar window is named by its period and time zone, and
		// its state by the window's start: "fw:100/month@Europe/Berlin".
		return string(append(b, p.cal.cal.String()...))
	}
	b = strconv.AppendInt(b, p.w, 10)
	if p.b != p.l {
		b = append(b, 'b')
		b = strconv.AppendInt(b, p.b, 10)
	}
	if p.alg.HoldsRequests && p.maxDelay != (p.b-1)*p.w {
		b = append(b, 'd')
		b = strconv.AppendInt(b, p.maxDelay, 10)
	}
	return string(b)
}

// checkBucketExact bounds the bucket scripts' products:
// 4×(B×W' + max_delay×L' + L') <= 2^53, with L' and W' reduced.
func checkBucketExact(p *params) error {
	g := gcd(p.l, p.w)
	sum := uint64(0)
	for _, term := range [][2]uint64{{uint64(p.b), uint64(p.w / g)}, {uint64(p.maxDelay / g), 1}, {uint64(p.l / g), 1}} {
		hi, lo := bits.Mul64(term[0], term[1])
		var carry uint64
		sum, carry = bits.Add64(sum, lo, 0)
		if hi != 0 || carry != 0 {
			return errBucketInexact
		}
	}
	if sum > redisExact/4 {
		return errBucketInexact
	}
	return nil
}

var errBucketInexact = errors.New("burst, window and max_delay are too large to decide exactly in Redis")

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

package redisstore

import (
	"errors"
	"math/bits"
	"strconv"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// algorithm is what the Redis store needs of one algorithm, beside what
// limiter's own table says of it (its Traits).
type algorithm struct {
	name limiter.Algorithm
	// scripts are the Redis scripts' sources; keySuffix starts the
	// policy part of every Redis key (see policyTag), so algorithms never
	// read each other's state.
	scripts   scripts
	keySuffix string
	// calendarScripts, when set, decide for a policy with a Calendar,
	// whose windows the instance names for the script (see
	// calendar_window.lua).
	calendarScripts scripts
	// redisArgs are the policy's arguments to the script, from L and W
	// on (cost and now come first); the bucket scripts take L and W
	// reduced.
	redisArgs func(p *limiter.Compiled) []any
	// refundArg is the argument a refund sends after the policy's, to
	// say which admission it gives back; nil sends none.
	refundArg func(r *Store, taken limiter.Receipt) any
	// holdsSlots is set when every admission holds a slot id of its own
	// (passed as the take's extra argument), which its refund names.
	holdsSlots bool
	// checkExact refuses policies the script cannot decide exactly in
	// Lua's doubles, beyond the window bound every algorithm has; nil
	// means that bound suffices.
	checkExact func(p *limiter.Compiled) error
}

// algorithmTable describes every algorithm; the order is
// limiter.Algorithms'.
var algorithmTable = []*algorithm{
	{
		name:      limiter.TokenBucket,
		scripts:   mustScripts("bucket.lua", "token_bucket.lua", "bucket_save.lua"),
		keySuffix: "tb",
		redisArgs: func(p *limiter.Compiled) []any {
			l, w := reduced(p)
			return []any{l, w, p.B, p.MaxAhead}
		},
		checkExact: checkBucketExact,
	},
	{
		name:      limiter.LeakyBucket,
		scripts:   mustScripts("bucket.lua", "leaky_bucket.lua", "bucket_save.lua"),
		keySuffix: "lb",
		redisArgs: func(p *limiter.Compiled) []any {
			l, w := reduced(p)
			return []any{l, w, p.MaxDelay / gcd(p.L, p.W), p.MaxAhead}
		},
		checkExact: checkBucketExact,
	},
	{
		name:            limiter.FixedWindow,
		scripts:         mustScripts("window.lua", "window_state.lua", "fixed_window.lua", "window_count.lua"),
		calendarScripts: mustScripts("window_state.lua", "calendar_window.lua", "window_count.lua"),
		keySuffix:       "fw",
		redisArgs:       windowArgs,
		refundArg:       refundAt,
	},
	{
		name:      limiter.SlidingWindowLog,
		scripts:   mustScripts("sliding_window_log.lua"),
		keySuffix: "swl",
		// A lease's units are logged at the end of its lifetime (see
		// limiter's slidingLogState.takeUpTo), which the script is told.
		redisArgs: func(p *limiter.Compiled) []any {
			return []any{p.L, p.W, limiter.LeaseLifetime.Microseconds()}
		},
		refundArg: refundAt,
	},
	{
		name:      limiter.SlidingWindowCounter,
		scripts:   mustScripts("window.lua", "sliding_window_counter.lua"),
		keySuffix: "swc",
		redisArgs: windowArgs,
		refundArg: refundAt,
		checkExact: func(p *limiter.Compiled) error {
			if hi, lo := bits.Mul64(uint64(p.L), uint64(p.W)); hi != 0 || lo > redisExact/4 {
				return errors.New("events times window is too large to decide exactly in Redis")
			}
			return nil
		},
	},
	{
		name:       limiter.Concurrency,
		scripts:    mustScripts("concurrency.lua"),
		keySuffix:  "cc",
		redisArgs:  windowArgs,
		refundArg:  func(r *Store, taken limiter.Receipt) any { return r.slotName(taken.Slot) },
		holdsSlots: true,
	},
}

// epochs reports whether the algorithm's state has an epoch, which its
// scripts take as an argument and end their replies with (see
// lua/prelude.lua): every state but concurrency's, whose slots name
// themselves (a slot a reset erased is never released twice).
func (a *algorithm) epochs() bool { return !a.holdsSlots }

// lookupAlgorithm is a's entry; every known algorithm has one (see
// TestAlgorithmTable), so a compiled policy's is never nil.
func lookupAlgorithm(a limiter.Algorithm) *algorithm {
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
func windowArgs(p *limiter.Compiled) []any { return []any{p.L, p.W} }

// refundAt names an admission by the time it was counted at, which tells
// the window algorithms which window or log entry to give back to.
func refundAt(_ *Store, taken limiter.Receipt) any { return taken.Name() }

// reduced is L and W divided by their greatest common divisor: the bucket
// algorithms compute in time scaled by L, and the reduction changes no
// decision while keeping the products small.
func reduced(p *limiter.Compiled) (l, w int64) {
	g := gcd(p.L, p.W)
	return p.L / g, p.W / g
}

// policyTag names the limit a Redis key's state was written under: the
// algorithm's suffix, L/W (W in µs, or a calendar's period@zone) and, where they differ from their
// defaults, the burst (b) and max_delay (d, µs × L). Two stores of one zone
// name with different limits (two handlers, or a reload that changes the
// limit) therefore never read each other's state, which was written under
// other arithmetic: a fixed window's index under another W, or a bucket's
// tat under another rate. A reload that keeps the policy keeps the names,
// and so the counters.
func policyTag(alg *algorithm, p *limiter.Compiled) string {
	b := make([]byte, 0, 40)
	b = append(b, alg.keySuffix...)
	b = append(b, ':')
	b = strconv.AppendInt(b, p.L, 10)
	b = append(b, '/')
	if p.Windows != nil {
		// A calendar window is named by its period and time zone, and
		// its state by the window's start: "fw:100/month@Europe/Berlin".
		return string(append(b, p.Policy.Calendar.String()...))
	}
	b = strconv.AppendInt(b, p.W, 10)
	if p.B != p.L {
		b = append(b, 'b')
		b = strconv.AppendInt(b, p.B, 10)
	}
	if p.Policy.Algorithm.Traits().HoldsRequests && p.MaxDelay != (p.B-1)*p.W {
		b = append(b, 'd')
		b = strconv.AppendInt(b, p.MaxDelay, 10)
	}
	return string(b)
}

// checkBucketExact bounds the bucket scripts' products:
// 4×(B×W' + max_delay×L' + L') <= 2^53, with L' and W' reduced.
func checkBucketExact(p *limiter.Compiled) error {
	g := gcd(p.L, p.W)
	sum := uint64(0)
	for _, term := range [][2]uint64{{uint64(p.B), uint64(p.W / g)}, {uint64(p.MaxDelay / g), 1}, {uint64(p.L / g), 1}} {
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

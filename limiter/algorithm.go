package limiter

import "time"

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
	// Leases is set when a nearcache.Cache may take units of the limit ahead of
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

// algorithm is everything this package's stores need of one algorithm.
// What the Redis store needs (its scripts, key names and arguments) is its
// own table, in limiter/redisstore; what the near cache needs of a lease,
// in limiter/nearcache.
type algorithm struct {
	name Algorithm
	Traits
	// newTables makes a memory store's empty key tables for the
	// algorithm's per-key state type.
	newTables func() memoryTables
	// calendar is set when the algorithm takes a Calendar (Policy.Calendar)
	// instead of a Window.
	calendar bool
	// timeless is set when the state does not change with time (slots in
	// use), so a give-back reads no clock: a concurrency zone gives back
	// on every request, and the clock is a fifth of that call's cost.
	timeless bool
}

// algorithmTable describes every algorithm; the order is Algorithms'.
var algorithmTable = []*algorithm{
	{
		name:      TokenBucket,
		Traits:    Traits{Bucket: true, Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[tokenBucketState]() },
	},
	{
		name:      LeakyBucket,
		Traits:    Traits{Bucket: true, HoldsRequests: true},
		newTables: func() memoryTables { return newShardSet[leakyBucketState]() },
	},
	{
		name:      FixedWindow,
		Traits:    Traits{Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[fixedWindowState]() },
		calendar:  true,
	},
	{
		name:      SlidingWindowLog,
		Traits:    Traits{Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[slidingLogState]() },
	},
	{
		name:      SlidingWindowCounter,
		Traits:    Traits{Leases: true, Charges: true},
		newTables: func() memoryTables { return newShardSet[slidingCounterState]() },
	},
	{
		name:      Concurrency,
		Traits:    Traits{ReleasesOnFinish: true, DefaultWindow: time.Minute, QuotaUnit: "concurrent-requests"},
		newTables: func() memoryTables { return newShardSet[concurrencyState]() },
		timeless:  true,
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

package limiter

import "time"

// Decision is the answer to one request: whether it may pass and everything
// a client needs to know about the limit, so response headers are a pure
// function of it. It is a report only: what a store needs to take the
// units back is the Admission's Receipt.
type Decision struct {
	// Allowed is true when the request's units were taken.
	Allowed bool
	// Source says where the decision was made: by the store, or by a
	// nearcache.Cache from memory without asking it. (Beside Allowed, so the
	// two bytes share one word: a Decision is copied on every request.)
	Source Source
	// Remaining is how many unit requests would pass right now, never negative.
	Remaining int64
	// ResetAfter is how long until the key's state is empty again: the
	// quota fully restored if nothing else arrives.
	ResetAfter time.Duration
	// RetryAfter is, on a denial, the earliest time a request of the same
	// cost would pass if nothing else arrived. On a leaky-bucket admission
	// it is how long the request must be held before it continues.
	RetryAfter time.Duration

	// Time is when the store decided, in µs on the store's own clock (the
	// Redis server's for Redis): the headers count the reset from it, so
	// it falls exactly on the store's window ends. Zero when no store
	// decided.
	Time int64
}

// Source is where a Decision was made.
type Source uint8

// The sources of a decision.
const (
	// SourceStore: the store decided (for Redis, a round trip).
	SourceStore Source = iota
	// SourceLease: a nearcache.Cache spent units of a lease in memory.
	SourceLease
	// SourceDenyCache: a nearcache.Cache repeated a refusal of the store.
	SourceDenyCache
)

// String names the source as metrics and logs do.
func (s Source) String() string {
	switch s {
	case SourceLease:
		return "lease"
	case SourceDenyCache:
		return "deny_cache"
	}
	return "store"
}

// At is when the store decided, on the store's own clock (the Redis
// server's for Redis), so a reset time computed from it falls exactly on
// the store's window ends. It is the zero Time for a Decision no store made.
func (d Decision) At() time.Time {
	if d.Time == 0 {
		return time.Time{}
	}
	return time.UnixMicro(d.Time)
}

// microseconds converts the algorithms' microsecond counts to a Duration.
func microseconds(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}

// ceilDiv is ⌈a/b⌉ for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

package limiter

import "time"

// Decision is the answer to one request: whether it may pass and everything
// a client needs to know about the limit, so response headers are a pure
// function of it.
type Decision struct {
	// Allowed is true when the request's units were taken.
	Allowed bool
	// Source says where the decision was made: by the store, or by a
	// NearCache from memory without asking it. (Beside Allowed, so the
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

	// at is the store time of the decision in microseconds, which the
	// headers count the reset from.
	at int64
	// mark is the store's name for the admission whose units this
	// decision took, when it is not at: the time a sliding log entry is
	// logged at, or for a decision spent from a lease, the lease's grant.
	// Refund names it (admission), so a give-back reaches the window or
	// log entry its units were counted in, however long after.
	mark int64
	// slot names the concurrency slot a Redis decision took.
	slot string
	// leaseGen numbers the NearCache lease a decision was spent from, so
	// a refund goes back into that lease; zero for any other decision.
	leaseGen uint64
	// granted is how many units an admission took: its cost, or for a
	// lease (Leaser.TakeUpTo) what it was granted. Only the algorithms
	// that lease set it.
	granted int64
}

// Source is where a Decision was made.
type Source uint8

// The sources of a decision.
const (
	// SourceStore: the store decided (for Redis, a round trip).
	SourceStore Source = iota
	// SourceLease: a NearCache spent units of a lease in memory.
	SourceLease
	// SourceDenyCache: a NearCache repeated a refusal of the store.
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
	if d.at == 0 {
		return time.Time{}
	}
	return time.UnixMicro(d.at)
}

// admission names the admission d's units were counted in, for Refund.
func (d Decision) admission() int64 {
	if d.mark != 0 {
		return d.mark
	}
	return d.at
}

// Granted is how many units an admission took: its cost, or for a lease
// what it was granted; zero for a refusal and for the algorithms that do
// not lease.
func (d Decision) Granted() int64 { return d.granted }

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

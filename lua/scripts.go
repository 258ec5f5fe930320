// Package lua holds the Redis scripts of the Redis store, one per algorithm,
// embedded so a build carries exactly the scripts its Go code was tested with.
//
// Every script decides one request atomically inside Redis with the server's
// TIME as the clock, and mirrors the exact integer arithmetic of the memory
// store in package limiter, so the two stores agree decision for decision.
// The argument and reply layout is documented at the top of each file.
// Redis runs one script per call and scripts cannot call one another, so
// what they share is sent with each: prelude.lua (arguments, clock, exact
// division) starts every script, bucket.lua (reading the packed state)
// follows it in the two bucket algorithms' and bucket_save.lua (writing it)
// ends them, and window.lua (the window index) follows it in the two
// counters'.
// Each part defines only what its scripts use: the interpreter runs every
// definition on every call. Each exported script is that concatenation, still one
// atomic EVALSHA per decision.
package lua

import _ "embed"

//go:embed prelude.lua
var prelude string

//go:embed bucket.lua
var bucket string

//go:embed bucket_save.lua
var bucketSave string

//go:embed window.lua
var window string

//go:embed token_bucket.lua
var tokenBucket string

//go:embed leaky_bucket.lua
var leakyBucket string

//go:embed fixed_window.lua
var fixedWindow string

//go:embed sliding_window_log.lua
var slidingWindowLog string

//go:embed sliding_window_counter.lua
var slidingWindowCounter string

//go:embed concurrency.lua
var concurrency string

// TokenBucket is the token bucket's script; it also refunds, so a request
// denied by another zone gives its tokens back in one round trip.
func TokenBucket() string { return prelude + bucket + tokenBucket + bucketSave }

// LeakyBucket is the leaky bucket's script, which shares the token bucket's
// compact state but decides by queue wait and max_delay.
func LeakyBucket() string { return prelude + bucket + leakyBucket + bucketSave }

// FixedWindow is the fixed window's script; one small string per key keeps
// the window index beside the count, so a key read after its window ended
// is never mistaken for the current one.
func FixedWindow() string { return prelude + window + fixedWindow }

// SlidingWindowLog is the exact sliding window's script; its list grows
// with the quota, the price of exactness.
func SlidingWindowLog() string { return prelude + slidingWindowLog }

// SlidingWindowCounter is the approximate sliding window's script: two
// counts per key, whatever the quota.
func SlidingWindowCounter() string { return prelude + window + slidingWindowCounter }

// Concurrency is the in-flight limit's script; leases that lapse after the
// window return the units a crashed instance could not release.
func Concurrency() string { return prelude + concurrency }

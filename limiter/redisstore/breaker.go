package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by the errors a Redis store returns without
// asking Redis, because Redis has failed every decision for a while (see
// Breaker). Like any store error it means no decision was made, and the
// zone's fail mode applies; the difference is that the request did not
// wait for the timeout first.
var ErrUnavailable = errors.New("store is failing; not asked until it may have recovered")

// The stores sharing a Breaker stop asking a Redis that has failed every
// decision of theirs for DefaultBreakerAfter (BreakerOptions.After), and
// answer ErrUnavailable at once until DefaultBreakerOpenFor
// (BreakerOptions.OpenFor) has passed; then decisions go to Redis again,
// and one more failure stops them for another OpenFor. Without it every
// request during an outage would wait up to the timeout before its fail
// mode applied, and a Redis
// that stalled rather than refused would hold every request that long.
// One success ends the streak, so a Redis that is slow now and then, or a
// Cluster with one master down, is never cut off: only decisions that
// would have failed anyway are answered early.
const (
	DefaultBreakerAfter   = 100 * time.Millisecond
	DefaultBreakerOpenFor = 250 * time.Millisecond
)

// BreakerOptions are a Breaker's two timings; zero means the default.
// Operators tune them to their Redis: After short enough that an outage
// costs few requests a timeout each, long enough that a blip does not cut
// Redis off; OpenFor short enough that a recovery is noticed soon, long
// enough that a dead Redis is not asked too often.
type BreakerOptions struct {
	// After is how long every decision must fail before the breaker opens.
	After time.Duration
	// OpenFor is how long it stays open before Redis is asked again.
	OpenFor time.Duration
	// Clock times the streaks; nil means the monotonic clock, which
	// steps of the wall clock do not move.
	Clock limiter.Clock
}

// Breaker tracks a Redis's streak of failures for the stores that use it.
// Stores that share a client should share a Breaker (Options.Breaker):
// Redis fails or recovers for all of them at once, so one zone's success
// ends every zone's wait, and a zone that had little traffic during an
// outage does not go on failing over after a busier one has found Redis
// back. Times are nanoseconds on its clock; zero means unset.
type Breaker struct {
	clock func() int64
	// after and openFor are BreakerOptions in nanoseconds.
	after, openFor int64
	// since is when the current streak of failures began.
	since atomic.Int64
	// until is when decisions may go to Redis again.
	until atomic.Int64
	// shards are the breakers of a Ring's shards, by address, made as
	// they are first needed: each shard fails or recovers on its own,
	// and a dead shard must not stop the decisions of the others' keys.
	shards sync.Map // string → *Breaker
}

// NewBreaker returns a Breaker for the stores of one client, with the
// default timings.
func NewBreaker() *Breaker {
	b, _ := NewBreakerWith(BreakerOptions{}) // no negative timing to refuse
	return b
}

// NewBreakerWith returns a Breaker for the stores of one client with
// opts' timings, refusing negative ones.
func NewBreakerWith(opts BreakerOptions) (*Breaker, error) {
	if opts.After < 0 || opts.OpenFor < 0 {
		return nil, fmt.Errorf("breaker: negative timing (after %v, open for %v)", opts.After, opts.OpenFor)
	}
	b := &Breaker{after: int64(DefaultBreakerAfter), openFor: int64(DefaultBreakerOpenFor)}
	if c := opts.Clock; c != nil {
		b.clock = func() int64 { return c.Now().UnixNano() }
	} else {
		base := time.Now() // monotonic: wall-clock steps move nothing
		b.clock = func() int64 { return int64(time.Since(base)) + 1 }
	}
	if opts.After > 0 {
		b.after = int64(opts.After)
	}
	if opts.OpenFor > 0 {
		b.openFor = int64(opts.OpenFor)
	}
	return b, nil
}

// shard is the breaker of the shard named name, with b's timings, shared
// like b by every store on the client.
func (b *Breaker) shard(name string) *Breaker {
	if v, ok := b.shards.Load(name); ok {
		return v.(*Breaker)
	}
	v, _ := b.shards.LoadOrStore(name, &Breaker{clock: b.clock, after: b.after, openFor: b.openFor})
	return v.(*Breaker)
}

// anyOpen reports whether b or any of its shards' breakers is open.
func (b *Breaker) anyOpen() bool {
	open := b.open()
	if !open {
		b.shards.Range(func(_, v any) bool {
			open = v.(*Breaker).open()
			return !open
		})
	}
	return open
}

// open reports whether decisions should not go to Redis now.
func (b *Breaker) open() bool {
	until := b.until.Load()
	return until != 0 && b.clock() < until
}

// record notes the outcome of a decision Redis was asked for.
func (b *Breaker) record(err error) {
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		// The caller left: that says nothing of Redis.
		return
	case err == nil || !storeWide(err):
		if b.since.Load() != 0 {
			b.since.Store(0)
			b.until.Store(0)
		}
		return
	}
	now := b.clock()
	since := b.since.Load()
	if since == 0 {
		b.since.CompareAndSwap(0, now)
		return
	}
	if now-since >= b.after {
		b.until.Store(now + b.openFor)
	}
}

// storeWide reports whether err says Redis as a whole is failing, not that
// one decision went wrong: no answer or a broken connection (anything that
// is not a reply from Redis), a reply saying the server cannot serve now,
// or one refusing the client's configuration (credentials, permissions, a
// standalone client sent to a Cluster node). A protocol error is about
// the connection, never a key: Redis answers one and closes the
// connection, for instance to a client that has not authenticated and
// sends a command of more than a few arguments, as a script call is
// ("ERR Protocol error: unauthenticated multibulk length"). Any other
// error reply, say WRONGTYPE for a key another application wrote, is an
// answer about one key.
func storeWide(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	msg := re.Error()
	if strings.HasPrefix(msg, "ERR Protocol error") {
		return true
	}
	for _, prefix := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "READONLY", "BUSY", "TRYAGAIN", "OOM", "NOAUTH", "WRONGPASS", "NOPERM", "MOVED"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// replyError is an error reply from Redis, as go-redis reports one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// TestBreakerSteps checks the breaker's rules on a stepped clock: a streak
// of failures opens it only once it has lasted DefaultBreakerAfter, it then stays
// open for DefaultBreakerOpenFor, one failure after that opens it again at once,
// and one success, or an answer about a single key, ends the streak.
func TestBreakerSteps(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	b, _ := NewBreakerWith(BreakerOptions{Clock: clock})
	step := clock.Advance
	down := fmt.Errorf("redis: %w", context.DeadlineExceeded)

	check := func(when string, want bool) {
		t.Helper()
		if got := b.open(); got != want {
			t.Fatalf("%s: open = %v, want %v", when, got, want)
		}
	}
	b.record(down)
	check("after one failure", false)
	step(DefaultBreakerAfter - time.Millisecond)
	b.record(down)
	check("a streak shorter than DefaultBreakerAfter", false)
	step(time.Millisecond)
	b.record(down)
	check("a streak of DefaultBreakerAfter", true)
	step(DefaultBreakerOpenFor - time.Millisecond)
	check("within DefaultBreakerOpenFor", true)
	step(time.Millisecond)
	check("after DefaultBreakerOpenFor", false)
	b.record(down)
	check("one more failure", true)
	step(DefaultBreakerOpenFor)
	b.record(nil)
	check("after a success", false)
	b.record(down)
	step(DefaultBreakerAfter)
	b.record(replyError("WRONGTYPE Operation against a key holding the wrong kind of value"))
	b.record(down)
	check("an answer about one key ended the streak", false)
	step(DefaultBreakerAfter)
	b.record(context.Canceled)
	b.record(down)
	check("a caller that left neither failed nor ended the streak", true)
}

func TestStoreWide(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{fmt.Errorf("take: %w", replyError("LOADING Redis is loading the dataset in memory")), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("WRONGPASS invalid username-password pair or user is disabled."), true},
		{replyError("NOAUTH Authentication required."), true},
		{replyError("MOVED 7854 127.0.0.1:7001"), true},
		{replyError("ERR Protocol error: unauthenticated multibulk length"), true},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyError("ERR Error running script"), false},
	} {
		if got := storeWide(tt.err); got != tt.want {
			t.Errorf("storeWide(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestRedisBreakerWhenPaused checks the breaker against a real stalled
// Redis: once decisions have failed for DefaultBreakerAfter, callers are answered
// ErrUnavailable at once instead of after the timeout, and once Redis
// answers again decisions resume within DefaultBreakerOpenFor and a margin.
func TestRedisBreakerWhenPaused(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	const timeout = 100 * time.Millisecond
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 1000, Window: time.Minute}, Options{Zone: "breaker", Timeout: timeout})
	ctx := context.Background()
	// A first decision before the pause, which on a loaded machine may
	// need more than one try: it dials and loads the script.
	testutil.Eventually(t, "a first decision", func() error {
		_, err := r.Take(ctx, "k", 1)
		return err
	})
	s.Pause()
	defer s.Resume()

	// Callers keep asking until they are turned away without waiting.
	start := time.Now()
	var fast int
	for fast < 5 {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no decision failed fast within 5s of pausing Redis")
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range 4 {
			wg.Go(func() {
				t0 := time.Now()
				_, err := r.Take(ctx, "k", 1)
				took := time.Since(t0)
				switch {
				case err == nil:
					t.Error("Take answered while Redis was paused")
				case errors.Is(err, ErrUnavailable):
					if took > timeout/4 {
						t.Errorf("turned away after %v, want at once", took)
					}
					mu.Lock()
					fast++
					mu.Unlock()
				case !errors.Is(err, ErrTimeout):
					t.Errorf("error %v wraps neither ErrStoreTimeout nor ErrStoreUnavailable", err)
				}
			})
		}
		wg.Wait()
	}
	if opened := time.Since(start); opened < DefaultBreakerAfter {
		t.Errorf("turned callers away %v after the pause, before DefaultBreakerAfter (%v)", opened, DefaultBreakerAfter)
	}

	s.Resume()
	resumed := time.Now()
	for {
		_, err := r.Take(ctx, "k", 1)
		if err == nil {
			break
		}
		if time.Since(resumed) > DefaultBreakerOpenFor+2*time.Second {
			t.Fatalf("no decision %v after resuming: %v", time.Since(resumed), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("decisions resumed %v after Redis did", time.Since(resumed))
}

// TestRedisBreakerShared checks that stores sharing a Breaker fail over and
// come back together: once one store's failures have opened it, another
// store is turned away at once, and once Redis answers one store, the
// other asks Redis again at once instead of failing over for the rest of
// DefaultBreakerOpenFor.
func TestRedisBreakerShared(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	step := clock.Advance
	shared, _ := NewBreakerWith(BreakerOptions{Clock: clock})
	opts := func(zone string) Options {
		return Options{Zone: zone, Timeout: 50 * time.Millisecond, Breaker: shared}
	}
	policy := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 1000, Window: time.Minute}
	busy := newTestRedis(t, client, policy, opts("busy"))
	quiet := newTestRedis(t, client, policy, opts("quiet"))
	ctx := context.Background()

	s.Pause()
	defer s.Resume()
	for range 2 {
		if _, err := busy.Take(ctx, "k", 1); !errors.Is(err, ErrTimeout) {
			t.Fatalf("busy zone while paused: %v, want a timeout", err)
		}
		step(DefaultBreakerAfter)
	}
	if _, err := quiet.Take(ctx, "k", 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("quiet zone after the busy one opened the breaker: %v, want ErrStoreUnavailable at once", err)
	}

	s.Resume()
	step(DefaultBreakerOpenFor)
	testutil.Eventually(t, "the busy zone to decide after resuming", func() error {
		_, err := busy.Take(ctx, "k", 1)
		if err != nil {
			step(DefaultBreakerOpenFor) // a failure reopened it; let the next try through
		}
		return err
	})
	// No time passes on the breaker's clock: only the busy zone's success
	// can have let the quiet one through.
	if d, err := quiet.Take(ctx, "k", 1); err != nil || !d.Allowed {
		t.Fatalf("quiet zone right after the busy one reached Redis: %+v %v", d, err)
	}
}

// TestBreakerWithTimings: the timings of NewBreakerWith replace the
// defaults, zero keeps them, and negative ones are refused.
func TestBreakerWithTimings(t *testing.T) {
	b, err := NewBreakerWith(BreakerOptions{After: time.Second, OpenFor: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if b.after != int64(time.Second) || b.openFor != int64(3*time.Second) {
		t.Errorf("timings %v, %v; want 1s, 3s", time.Duration(b.after), time.Duration(b.openFor))
	}
	if b, _ = NewBreakerWith(BreakerOptions{}); b.after != int64(DefaultBreakerAfter) || b.openFor != int64(DefaultBreakerOpenFor) {
		t.Errorf("zero timings gave %v, %v; want the defaults", time.Duration(b.after), time.Duration(b.openFor))
	}
	for _, o := range []BreakerOptions{{After: -1}, {OpenFor: -1}} {
		if _, err := NewBreakerWith(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// TestBreakerShards: the breakers of a Ring's shards keep their own
// streaks with the client's timings, one per name, and the client's
// breaker reports open (anyOpen) while any of them is.
func TestBreakerShards(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	b, _ := NewBreakerWith(BreakerOptions{Clock: clock, After: 10 * time.Millisecond, OpenFor: time.Second})
	down := fmt.Errorf("redis: %w", context.DeadlineExceeded)
	dead, live := b.shard("10.0.0.1:6379"), b.shard("10.0.0.2:6379")
	if b.shard("10.0.0.1:6379") != dead {
		t.Fatal("a second shard breaker for one name")
	}
	dead.record(down)
	clock.Advance(10 * time.Millisecond)
	live.record(nil) // the other shard answers meanwhile
	dead.record(down)
	if !dead.open() || live.open() || b.open() {
		t.Fatalf("dead %v, live %v, client %v: want only the dead shard's open", dead.open(), live.open(), b.open())
	}
	if !b.anyOpen() {
		t.Error("anyOpen false with a shard's breaker open")
	}
	clock.Advance(time.Second)
	if dead.open() || b.anyOpen() {
		t.Error("still open after OpenFor, the client's timing")
	}
}

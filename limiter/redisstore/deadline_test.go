package redisstore

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/redis/go-redis/v9"
)

// TestDeadlinesClose checks the bound deadlines give: never before timeout,
// at most a tick after it, and Done closes once the deadline has passed.
func TestDeadlinesClose(t *testing.T) {
	const timeout = 40 * time.Millisecond
	d := newDeadlines(timeout)
	start := time.Now()
	at, done := d.after(timeout)
	if at.Before(start.Add(timeout)) || at.After(time.Now().Add(timeout+d.tick)) {
		t.Fatalf("deadline %v after start, want within [%v, %v]", at.Sub(start), timeout, timeout+d.tick)
	}
	select {
	case <-done:
		t.Fatal("Done closed at once")
	default:
	}
	select {
	case <-done:
		if now := time.Now(); now.Before(at) {
			t.Errorf("Done closed %v before the deadline", at.Sub(now))
		}
		if late := time.Since(at); late > 250*time.Millisecond {
			t.Errorf("Done closed %v after the deadline", late)
		}
	case <-time.After(time.Second):
		t.Fatal("Done never closed")
	}
}

// TestDeadlinesShareTicks checks that decisions ending in one tick share
// its channel, which is what saves a timer per decision.
func TestDeadlinesShareTicks(t *testing.T) {
	d := newDeadlines(time.Second) // ticks of 125ms: consecutive calls share one
	for range 10 {
		at1, done1 := d.after(time.Second)
		at2, done2 := d.after(time.Second)
		if at1.Equal(at2) {
			if done1 != done2 {
				t.Fatal("two decisions ending in one tick got different channels")
			}
			return
		}
	}
	t.Fatal("ten pairs of calls 125ms ticks apart never fell in one tick")
}

// TestDeadlinesStaleCell: a caller that finds its cell already taken by a
// later tick still gets a channel that closes at its own deadline.
func TestDeadlinesStaleCell(t *testing.T) {
	const timeout = 20 * time.Millisecond
	d := newDeadlines(timeout)
	for i := range d.cells {
		d.cells[i].Store(&deadlineTick{n: 1 << 40, done: make(chan struct{})})
	}
	at, done := d.after(timeout)
	select {
	case <-done:
		if time.Now().Before(at) {
			t.Error("Done closed before the deadline")
		}
	case <-time.After(time.Second):
		t.Fatal("Done never closed")
	}
}

// TestDecisionContext checks the context a decision runs under: the
// caller's values, the deadline's Err, and a caller's sooner deadline kept.
func TestDecisionContext(t *testing.T) {
	type key struct{}
	const timeout = 20 * time.Millisecond
	d := newDeadlines(timeout)
	parent := context.WithValue(context.Background(), key{}, "v")
	ctx := d.bound(parent, timeout)
	if ctx.Value(key{}) != "v" {
		t.Error("the caller's values are lost")
	}
	if _, ok := ctx.Deadline(); !ok {
		t.Error("no deadline")
	}
	if err := ctx.Err(); err != nil {
		t.Errorf("Err before the deadline: %v", err)
	}
	<-ctx.Done()
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err after the deadline: %v, want DeadlineExceeded", err)
	}

	sooner, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if got := d.bound(sooner, timeout); got != sooner {
		t.Error("a caller's sooner deadline was replaced")
	}
}

// TestRedisTimeoutWhileDialing: go-redis dials in the background and stops
// waiting for the dial only when the context's Done closes. A host that
// never answers the dial (here a dialer that hangs for its whole 5s) must
// cost a decision no more than the timeout and a small margin.
func TestRedisTimeoutWhileDialing(t *testing.T) {
	const timeout = 20 * time.Millisecond
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:1",
		ContextTimeoutEnabled: true,
		DialTimeout:           5 * time.Second,
		DialerRetries:         1,
		MaxRetries:            -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Second):
				return nil, errors.New("test dialer gave up")
			}
		},
	})
	t.Cleanup(func() { client.Close() })
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Minute}, Options{Zone: "dial", Timeout: timeout})
	for i := range 3 {
		start := time.Now()
		_, err := r.Take(context.Background(), "k", 1)
		took := time.Since(start)
		if err == nil {
			t.Fatal("Take answered without a connection")
		}
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("take %d: error %v does not wrap ErrStoreTimeout", i, err)
		}
		if took > timeout+100*time.Millisecond {
			t.Errorf("take %d: failed after %v, want within %v and a small margin", i, took, timeout)
		}
	}
}

package redisstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// skewedStore is one instance in TestMixedClocksKeepFilledState: a Redis
// store and the clock it decides by, off the server's by off.
type skewedStore struct {
	name string
	r    *Store
	off  time.Duration
}

// now is the store's clock: the server's TIME (the machine's clock, on
// loopback) moved by off.
func (s skewedStore) now() time.Time { return time.Now().Add(s.off) }

// TestMixedClocksKeepFilledState: one instance decides by Redis's TIME,
// another by its own clock (its ACL user lacks +time), 300 ms off the
// server's, within the second of skew docs/redis.md allows. Whichever clock
// filled a key's state, the other instance, whose clock still says that
// state is in force, finds it and admits no more than it leaves: the key
// outlives its state by the skew allowed, whatever clock wrote it. (Before
// the fix, a key written on Redis's clock expired at its state's end on
// that clock: 20-odd ms after a fixed window filled by the instance on
// Redis's clock ended there, the instance 300 ms behind, still in that
// window, found no key and admitted a full window more.) Each case runs
// where the instance's clock is behind the server's and where it is ahead.
func TestMixedClocksKeepFilledState(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	rule := slices.DeleteFunc(documentedACL(t), func(w string) bool { return w == "+time" })
	s.SetUser(t, aclUser, rule)
	server, noTime := s.Client(t), aclClient(t, []string{s.Addr()})

	const (
		limit  = 5
		window = time.Second
		skew   = 300 * time.Millisecond
	)
	onTime := NewServerClock(server, nil)
	behind, ahead := NewServerClock(noTime, nil), NewServerClock(noTime, nil)
	behind.SetInstanceClock(limiter.ClockFunc(func() time.Time { return time.Now().Add(-skew) }))
	ahead.SetInstanceClock(limiter.ClockFunc(func() time.Time { return time.Now().Add(skew) }))
	for _, c := range []*ServerClock{onTime, behind, ahead} {
		if err := c.Probe(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if onTime.Instance() || !behind.Instance() || !ahead.Instance() {
		t.Fatal("the stores are not on the clocks the test wants: one on Redis's TIME, two on the instance's")
	}

	w := window.Microseconds()
	idx := func(at time.Time) int64 { return at.UnixMicro() / w }
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter, limiter.SlidingWindowLog, limiter.TokenBucket} {
		p := limiter.Policy{Algorithm: alg, Events: limit, Window: window}
		open := func(name string, client redis.UniversalClient, clock *ServerClock, off time.Duration) skewedStore {
			r := newTestRedis(t, client, p, Options{Zone: "skew", Timeout: time.Second, ServerClock: clock})
			return skewedStore{name, r, off}
		}
		redisTime := open("Redis's TIME", server, onTime, 0)
		for _, pair := range [][2]skewedStore{
			{redisTime, open("an instance clock behind", noTime, behind, -skew)},
			{open("an instance clock ahead", noTime, ahead, skew), redisTime},
		} {
			filler, checker := pair[0], pair[1]
			what := fmt.Sprintf("%s: filled on %s, then decided on %s", alg, filler.name, checker.name)
			// attempt fills a key on filler's clock, waits until the
			// state would be gone on the server had its key no pad,
			// and takes on checker's clock. It reports the admissions,
			// the most the state allows, and whether the timing held
			// (a loaded machine may stall a step past the window the
			// check needs).
			attempt := func(key string) (admitted, allowed int64, timed bool) {
				if alg == limiter.FixedWindow { // fill in the last 100 ms of a window
					f := filler.now()
					wait := time.Duration((idx(f)+1)*w-f.UnixMicro())*time.Microsecond - 100*time.Millisecond
					if wait < 0 {
						wait += window
					}
					time.Sleep(wait)
				}
				f0 := filler.now()
				for i := range limit {
					if d, err := filler.r.Take(ctx, key, 1); err != nil || !d.Allowed {
						t.Fatalf("%s: filling take %d: %+v %v", what, i+1, d, err)
					}
				}
				f1 := filler.now()
				// When the state ends on the filler's clock; its key,
				// unpadded, would expire then on the server's.
				var ends time.Time
				switch alg {
				case limiter.FixedWindow:
					ends = time.UnixMicro((idx(f1) + 1) * w)
				case limiter.SlidingWindowCounter:
					ends = time.UnixMicro((idx(f1) + 2) * w)
				default: // the last log entry, or the bucket's tat
					ends = f1.Add(window)
				}
				time.Sleep(time.Until(ends.Add(-filler.off + 30*time.Millisecond)))
				c0 := checker.now()
				for range limit {
					d, err := checker.r.Take(ctx, key, 1)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				c1 := checker.now()
				switch alg {
				case limiter.FixedWindow:
					// Still in the filled window: nothing more.
					return admitted, 0, idx(f0) == idx(f1) && idx(c1) == idx(f0)
				case limiter.SlidingWindowCounter:
					// In the next window, the filled one weighs
					// (W − e)/W: admissions n need L(W − e) + nW ≤ LW.
					e := c1.UnixMicro() - idx(c1)*w
					return admitted, limit * e / w, idx(f0) == idx(f1) && idx(c0) == idx(f0)+1 && idx(c1) == idx(c0)
				case limiter.SlidingWindowLog:
					// Every entry still within a window of the checker's
					// decisions: nothing more.
					return admitted, 0, c1.Before(f0.Add(window))
				default:
					// Refilled since the first take at the most: r × elapsed.
					n := limit * c1.Sub(f0).Microseconds() / w
					return admitted, n, n < limit
				}
			}
			timed := false
			for i := 0; i < 4 && !timed; i++ {
				var admitted, allowed int64
				admitted, allowed, timed = attempt(fmt.Sprintf("k-%s-%d", filler.name, i))
				if timed && admitted > allowed {
					t.Errorf("%s: admitted %d of %d, the state allows %d", what, admitted, limit, allowed)
				}
			}
			if !timed {
				t.Fatalf("%s: four tries missed the timing the check needs (the machine is too loaded)", what)
			}
		}
	}
}

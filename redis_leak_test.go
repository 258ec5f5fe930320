package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestRedisHandlerNoGoroutineLeak provisions a Handler with redis zones in
// this process, serves requests with Redis up, paused and back, cleans up,
// and checks that no goroutine outlives it. It does not run in parallel,
// and it counts only goroutines that run or were started by go-redis or
// this module (see ownGoroutines), so goroutines of other tests winding
// down cannot hide a leak or fake one.
func TestRedisHandlerNoGoroutineLeak(t *testing.T) {
	srv := redistest.Start(t)
	input := fmt.Sprintf(`rate_limit {
		zone leak_open {
			key ip
			algorithm sliding_window_log
			events 1000
			window 1h
			store redis
		}
		zone leak_local {
			key ip
			algorithm concurrency
			events 100
			store redis
			fail local
		}
		zone leak_closed {
			match {
				path /closed
			}
			key ip
			algorithm token_bucket
			rate 1000/1h
			store redis
			fail closed
		}
		redis {
			url redis://%s
			timeout 50ms
		}
	}`, srv.Addr())
	cycle := func() {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		req := func(path string) int {
			r, _ := newKeyRequest("198.51.100.40", nil)
			r.URL.Path = path
			_, code := serve(h, r, okHandler)
			return code
		}
		many := func(n int) {
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { req([]string{"/", "/closed"}[i%2]) })
			}
			wg.Wait()
		}
		many(20)
		srv.Pause()
		many(20)
		srv.Resume()
		many(20)
		if err := h.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
	// A first cycle starts whatever Caddy and go-redis start once per
	// process; only a second one can show what a handler leaves behind.
	cycle()
	// Goroutines on their way out (readers of closed connections) go.
	waitOwnGoroutinesGone(t, "the first cycle")
	total := runtime.NumGoroutine()
	cycle()
	waitOwnGoroutinesGone(t, "the second cycle")
	t.Logf("goroutines in the process: %d before the second cycle, %d after its Cleanup", total, runtime.NumGoroutine())
}

// ownGoroutines returns the stacks of the goroutines that run code of
// go-redis or of this module, or were started by it.
func ownGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var own []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		// This test, parallel tests parked until it ends, and the
		// harness's wait for redis-server are not the handler's.
		if strings.Contains(g, "TestRedisHandlerNoGoroutineLeak") || strings.Contains(g, "testing.(*T).Parallel") ||
			strings.Contains(g, "/internal/redistest.") {
			continue
		}
		if strings.Contains(g, "github.com/redis/go-redis/") ||
			strings.Contains(g, "github.com/floodgatehq/caddy-ratelimit.") ||
			strings.Contains(g, "github.com/floodgatehq/caddy-ratelimit/limiter.") {
			own = append(own, g)
		}
	}
	return own
}

// waitOwnGoroutinesGone fails the test unless every goroutine of go-redis
// or Floodgate ends soon after Cleanup: the client is closed by then, and
// the readers of its connections only need to notice.
func waitOwnGoroutinesGone(t *testing.T, what string) {
	t.Helper()
	testutil.Eventually(t, what+": the goroutines of go-redis and Floodgate to end after Cleanup", func() error {
		if left := ownGoroutines(); len(left) > 0 {
			return fmt.Errorf("%d left:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

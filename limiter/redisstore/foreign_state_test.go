package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisForeignStateFailsTheDecision: state in Redis that Floodgate did
// not write (nan, inf, hex, a float, a value of the wrong shape or type) is
// an error for the decision, naming the key, and is left as it was: never
// read as a fresh quota. Lua's tonumber takes nan, inf and 0x10. (A fixed
// window's "<window>:nan" let 5 of 50 requests through a zone of 3 and
// was rewritten as if new.)
func TestRedisForeignStateFailsTheDecision(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	const window = time.Hour
	win := time.Now().UnixMicro() / window.Microseconds()
	foreign := map[limiter.Algorithm][]string{
		limiter.FixedWindow:          {"nan", fmt.Sprintf("%d:nan", win), fmt.Sprintf("%d:inf", win), fmt.Sprintf("%d:0x10", win), fmt.Sprintf("%d:1.5", win), fmt.Sprintf("%d:-1", win), fmt.Sprintf("%d", win), fmt.Sprintf("nan:%d", 1)},
		limiter.SlidingWindowCounter: {fmt.Sprintf("%d:0:nan", win), fmt.Sprintf("%d:inf:0", win), fmt.Sprintf("0x%x:0:1", win), "1:2"},
		limiter.TokenBucket:          {"nan", "inf", "0x10", "1e300", "-5", "1:nan"},
		limiter.LeakyBucket:          {"nan", "inf", "12.5"},
	}
	for alg, values := range foreign {
		p := limiter.Policy{Algorithm: alg, Events: 3, Window: window}
		r := newTestRedis(t, client, p, Options{Zone: "foreign", Timeout: time.Second})
		for _, v := range values {
			key := "client-" + v
			if err := client.Set(ctx, r.Key(key), v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := r.Take(ctx, key, 1)
			if err == nil || !strings.Contains(err.Error(), "does not write") || !strings.Contains(err.Error(), r.Key(key)) {
				t.Errorf("%s state %q: %+v, %v; want an error naming the key", alg, v, d, err)
			}
			if got, _ := client.Get(ctx, r.Key(key)).Result(); got != v {
				t.Errorf("%s state %q was rewritten as %q", alg, v, got)
			}
		}
	}
	// A sliding log's entries are times in µs.
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 3, Window: window}, Options{Zone: "foreign", Timeout: time.Second})
	for _, v := range []string{"nan", "inf", "0x10", "1.5e15"} {
		key := "log-" + v
		if err := client.RPush(ctx, r.Key(key), v).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := r.Take(ctx, key, 1); err == nil {
			t.Errorf("sliding log entry %q: %+v, want an error", v, d)
		}
	}
	// A value of another type fails the decision too (WRONGTYPE).
	fw := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 3, Window: window}, Options{Zone: "foreign", Timeout: time.Second})
	if err := client.HSet(ctx, fw.Key("hash"), "a", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := fw.Take(ctx, "hash", 1); err == nil {
		t.Errorf("a hash as a fixed window's state: %+v, want an error", d)
	}
}

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
// not write (nan, inf, hex, a float, a value of the wrong shape or type),
// for every algorithm and for a calendar window (whose script reads its
// state apart from fixed_window.lua), is an error for the decision,
// naming the key, and is left as it was: never
// read as a fresh quota. Lua's tonumber takes nan, inf and 0x10. (A fixed
// window's "<window>:nan" let 5 of 50 requests through a zone of 3 and
// was rewritten as if new.)
func TestRedisForeignStateFailsTheDecision(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	const window = time.Hour
	win := time.Now().UnixMicro() / window.Microseconds()
	// A calendar window's state names its window by its start, in µs.
	now := time.Now().UTC()
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	windowed := func(alg limiter.Algorithm) limiter.Policy {
		return limiter.Policy{Algorithm: alg, Events: 3, Window: window}
	}
	for _, tc := range []struct {
		name   string
		p      limiter.Policy
		values []string
	}{
		{"fixed_window", windowed(limiter.FixedWindow), []string{"nan", fmt.Sprintf("%d:nan", win), fmt.Sprintf("%d:inf", win), fmt.Sprintf("%d:0x10", win), fmt.Sprintf("%d:1.5", win), fmt.Sprintf("%d:-1", win), fmt.Sprintf("%d", win), fmt.Sprintf("nan:%d", 1), fmt.Sprintf("%d:1@nan", win), fmt.Sprintf("%d:1@", win), fmt.Sprintf("%d:1@1.5", win), fmt.Sprintf("%d:1@2@3", win)}},
		{"calendar fixed_window", limiter.Policy{Algorithm: limiter.FixedWindow, Events: 3, Calendar: &limiter.Calendar{Period: limiter.Month}}, []string{"nan", fmt.Sprintf("%d:nan", month), fmt.Sprintf("%d:inf", month), fmt.Sprintf("%d:0x10", month), fmt.Sprintf("%d:1.5", month), fmt.Sprintf("%d:-1", month), fmt.Sprintf("%d", month)}},
		{"sliding_window_counter", windowed(limiter.SlidingWindowCounter), []string{fmt.Sprintf("%d:0:nan", win), fmt.Sprintf("%d:inf:0", win), fmt.Sprintf("0x%x:0:1", win), "1:2", fmt.Sprintf("%d:0:1@inf", win)}},
		{"token_bucket", windowed(limiter.TokenBucket), []string{"nan", "inf", "0x10", "1e300", "-5", "1:nan", "5@nan", "nan@5", "@5"}},
		{"leaky_bucket", windowed(limiter.LeakyBucket), []string{"nan", "inf", "12.5"}},
	} {
		r := newTestRedis(t, client, tc.p, Options{Zone: "foreign", Timeout: time.Second})
		for _, v := range tc.values {
			key := "client-" + v
			if err := client.Set(ctx, r.Key(key), v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := r.Take(ctx, key, 1)
			if err == nil || !strings.Contains(err.Error(), "does not write") || !strings.Contains(err.Error(), r.Key(key)) {
				t.Errorf("%s state %q: %+v, %v; want an error naming the key", tc.name, v, d, err)
			}
			if got, _ := client.Get(ctx, r.Key(key)).Result(); got != v {
				t.Errorf("%s state %q was rewritten as %q", tc.name, v, got)
			}
		}
	}
	// A sliding log's entries are times in µs.
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 3, Window: window}, Options{Zone: "foreign", Timeout: time.Second})
	for _, v := range []string{"nan", "inf", "0x10", "1.5e15", "enan", "e", "e1.5"} {
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

// TestRedisStateBeforeEpochs: a state written before states had epochs
// (lua/prelude.lua) is read as it stands, and the next take gives it its
// epoch, to which that take's give-back goes back, for every algorithm
// that has one.
func TestRedisStateBeforeEpochs(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	const window = time.Hour
	now := time.Now().UnixMicro()
	win := now / window.Microseconds()
	for _, tc := range []struct {
		alg   limiter.Algorithm
		state func(r *Store, key string) error
	}{
		{limiter.FixedWindow, func(r *Store, key string) error {
			return client.Set(ctx, r.Key(key), fmt.Sprintf("%d:2", win), time.Minute).Err()
		}},
		{limiter.SlidingWindowCounter, func(r *Store, key string) error {
			return client.Set(ctx, r.Key(key), fmt.Sprintf("%d:0:2", win), time.Minute).Err()
		}},
		{limiter.TokenBucket, func(r *Store, key string) error {
			// Two tokens short of full (L = 3 per hour, reduced to 1 per
			// 1.2e9 µs): tat 2.4e9 µs ahead, packed with L' = 1.
			return client.Set(ctx, r.Key(key), fmt.Sprintf("%d", now+2*window.Microseconds()/3), time.Hour).Err()
		}},
		{limiter.SlidingWindowLog, func(r *Store, key string) error {
			return client.RPush(ctx, r.Key(key), fmt.Sprint(now), fmt.Sprint(now)).Err()
		}},
	} {
		t.Run(string(tc.alg), func(t *testing.T) {
			r := newTestRedis(t, client, limiter.Policy{Algorithm: tc.alg, Events: 3, Window: window}, Options{Zone: "before-epochs", Timeout: time.Second})
			if err := tc.state(r, "k"); err != nil {
				t.Fatal(err)
			}
			a, err := r.Take(ctx, "k", 1)
			if err != nil || !a.Allowed || a.Remaining != 0 || a.Receipt.Epoch == 0 {
				t.Fatalf("take on the old state: %+v, %v; want the last unit, with an epoch", a, err)
			}
			d, err := a.Release(ctx)
			if err != nil || d.Remaining != 1 {
				t.Fatalf("give-back: %+v, %v; want the unit back into the state", d, err)
			}
		})
	}
}

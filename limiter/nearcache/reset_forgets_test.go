package nearcache

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// TestResetForgetsOneKey: Reset starts one key afresh in both stores and in
// a near cache, and leaves every other key, and the same key of another
// zone, as they were.
func TestResetForgetsOneKey(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 3, Window: time.Hour}
	client := redistest.Start(t).Client(t)
	stores := map[string]func(zone string) limiter.Store{
		"memory": func(string) limiter.Store {
			m, err := limiter.NewMemory(p, limiter.MemoryOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		"redis": func(zone string) limiter.Store {
			return newTestRedis(t, client, p, redisstore.Options{Zone: zone, Timeout: 5 * time.Second})
		},
		"near cache": func(zone string) limiter.Store {
			cache, err := New(newTestRedis(t, client, p, redisstore.Options{Zone: zone, Timeout: 5 * time.Second}), p, Options{LeaseFraction: 1, DenyFor: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cache.Close(ctx) })
			return cache
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			zone := "reset-" + name
			s, other := open(zone), open(zone+"-other")
			for _, st := range []limiter.Store{s, other} {
				for _, key := range []string{"a/b:c", "d"} {
					for range 4 {
						if _, err := st.Take(ctx, key, 1); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if existed, err := s.Reset(ctx, "a/b:c"); err != nil || !existed {
				t.Fatalf("reset of a key with state: existed %v, %v", existed, err)
			}
			if existed, err := s.Reset(ctx, "a/b:c"); err != nil || existed {
				t.Fatalf("second reset: existed %v, %v, want false", existed, err)
			}
			peek := func(st limiter.Store, key string) int64 {
				d, err := st.Peek(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			if got := peek(s, "a/b:c"); got != 3 {
				t.Errorf("reset key: %d remaining, want all 3", got)
			}
			if got := peek(s, "d"); got != 0 {
				t.Errorf("another key: %d remaining after the reset, want 0", got)
			}
			if got := peek(other, "a/b:c"); got != 0 {
				t.Errorf("the key in another zone: %d remaining after the reset, want 0", got)
			}
			if d, _ := s.Take(ctx, "a/b:c", 1); !d.Allowed || d.Remaining != 2 {
				t.Errorf("first request after the reset: %+v", d)
			}
		})
	}
}

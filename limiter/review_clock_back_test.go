package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestReviewEveryInstanceGoesBackToRedisClock: the README says "When the
// server allows TIME again, they go back to Redis's clock". Only a
// NOSCRIPT makes a store on the instance's clock probe again, and after a
// failover only the first instance to reach the new server meets NOSCRIPT:
// its EVAL loads the script, so every other instance's EVALSHA succeeds,
// no probe runs there, and those instances stay on their own clocks for
// good (the zones API keeps saying "instance" on them), while the first
// decides by Redis's: the instances no longer share one clock.
//
// Two stores with a ServerClock each stand for two Caddy instances on one
// server; the ACL takes TIME away and gives it back, as in
// TestServerClockFollowsTheServer.
func TestReviewEveryInstanceGoesBackToRedisClock(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	server := func(cmd ...any) {
		t.Helper()
		if err := admin.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	p := Policy{Algorithm: TokenBucket, Events: 100, Window: time.Hour}
	server("ACL", "SETUSER", "default", "-time")
	var stores []*Redis
	for _, name := range []string{"first", "second"} {
		c := s.Client(t) // an instance's own client
		r := newTestRedis(t, c, p, RedisOptions{Zone: "back", Timeout: time.Second, ServerClock: NewServerClock(c, nil)})
		if err := r.Preload(ctx); err != nil {
			t.Fatal(err)
		}
		if !r.InstanceClock() {
			t.Fatalf("%s: not on the instance's clock on a server refusing TIME", name)
		}
		stores = append(stores, r)
	}

	// The server allows TIME again and has lost its scripts (a failover
	// to a server that allows TIME).
	server("ACL", "SETUSER", "default", "+time")
	time.Sleep(reprobeAfter)
	server("SCRIPT", "FLUSH")
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; ; i++ {
		back := 0
		for _, r := range stores {
			if _, err := r.Take(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
			if !r.InstanceClock() {
				back++
			}
		}
		if back == len(stores) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s (%d decisions each) after the server allows TIME again, %d of %d instances are back on Redis's clock", i+1, back, len(stores))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisLeaseManyWrongTypeFailsAlone: limiter.LeaseBatcher promises
// that an error of one ask fails that ask alone. A key holding a value of
// another type (a hash) makes the algorithm's GET raise WRONGTYPE, which
// aborted the whole batch script rather than replying an error for that
// operation: the asks before it were applied (their units taken) and
// every ask of the call failed, so those units were stranded, and the asks
// after it were refused service because of another key. batch_close.lua
// now catches it with pcall.
func TestRedisLeaseManyWrongTypeFailsAlone(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	client := redistest.Start(t).Client(t)
	r := newTestRedis(t, client, p, Options{Zone: "wrongtype", Timeout: 5 * time.Second})
	if err := client.HSet(ctx, r.Key("foreign"), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	asks := []limiter.LeaseAsk{
		{Key: "before", Cost: 1, Want: 10},
		{Key: "foreign", Cost: 1, Want: 10},
		{Key: "after", Cost: 1, Want: 10},
	}
	answers := r.LeaseMany(ctx, asks)
	if answers[1].Err == nil {
		t.Errorf("the foreign key's ask was answered: %+v", answers[1].Admission)
	}
	for _, i := range []int{0, 2} {
		if answers[i].Err != nil || !answers[i].Allowed {
			t.Errorf("%s: %+v, %v; want its own lease, whatever another key holds", asks[i].Key, answers[i].Admission, answers[i].Err)
		}
	}
	if d, err := r.Peek(ctx, "before"); err == nil && d.Remaining != 100 && answers[0].Err != nil {
		t.Errorf("before: %d units taken in the store and its answer dropped (stranded)", 100-d.Remaining)
	}
}

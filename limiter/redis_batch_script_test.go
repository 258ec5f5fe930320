package limiter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestRedisRefundManyAndRenew gives back leases of 150 keys in one
// RefundMany and renews one, on a standalone Redis, where the give-backs
// go 64 to a script call, and on a Cluster, where the keys lie in
// different slots and go one to a call: either way every unit is back.
func TestRedisRefundManyAndRenew(t *testing.T) {
	ctx := context.Background()
	p := Policy{Algorithm: FixedWindow, Events: 100, Window: time.Hour}
	standalone := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
	}{
		{"standalone", standalone.Client(t)},
		{"cluster", redistest.StartCluster(t, 3).Client(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRedis(t, tc.client, p, RedisOptions{Zone: "many", Timeout: 5 * time.Second})
			if err := r.Preload(ctx); err != nil { // no NOSCRIPT retry in the count
				t.Fatal(err)
			}
			const keys = 150
			backs := make([]Refund, keys)
			for i := range backs {
				key := "k" + strconv.Itoa(i)
				d, err := r.TakeUpTo(ctx, key, 1, 10)
				if err != nil || d.Granted() != 10 {
					t.Fatalf("lease of %s: %+v, %v", key, d, err)
				}
				backs[i] = Refund{Key: key, Cost: 7, Taken: d}
			}
			if c, ok := tc.client.(*redis.Client); ok {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.RefundMany(ctx, backs); err != nil {
				t.Fatal(err)
			}
			if c, ok := tc.client.(*redis.Client); ok {
				calls, err := scriptCalls(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				if want := int64((keys + redisMaxGiveBacks - 1) / redisMaxGiveBacks); calls != want {
					t.Errorf("%d give-backs took %d script calls, want %d", keys, calls, want)
				}
			}
			for _, b := range backs {
				if d, err := r.Peek(ctx, b.Key); err != nil || d.Remaining != 97 {
					t.Fatalf("%s after the give-back: %+v, %v; want 97 left", b.Key, d, err)
				}
			}

			// A renewal gives back first, then leases from what that left.
			d, err := r.TakeUpTo(ctx, "k0", 1, 10)
			if err != nil || d.Remaining != 87 {
				t.Fatalf("lease: %+v, %v", d, err)
			}
			d, err = r.Renew(ctx, Refund{Key: "k0", Cost: 4, Taken: d}, 1, 91)
			if err != nil || !d.Allowed || d.Granted() != 91 || d.Remaining != 0 {
				t.Fatalf("renewal: %+v, %v; want 91 granted, 87+4 being all that was left", d, err)
			}
		})
	}
}

// TestRedisRefundManyRefuses: a cost outside the policy's range fails the
// whole call before anything is sent.
func TestRedisRefundManyRefuses(t *testing.T) {
	s := redistest.Start(t)
	r := newTestRedis(t, s.Client(t), Policy{Algorithm: FixedWindow, Events: 10, Window: time.Hour}, RedisOptions{Zone: "refuse"})
	err := r.RefundMany(context.Background(), []Refund{{Key: "a", Cost: 1}, {Key: "b", Cost: 11}})
	if err == nil {
		t.Fatal("a refund of 11 units under a limit of 10 was accepted")
	}
	if _, err := r.Renew(context.Background(), Refund{Key: "a", Cost: 0}, 1, 2); err == nil {
		t.Fatal("a renewal giving back 0 units was accepted")
	}
}

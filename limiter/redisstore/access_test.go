package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/redis/go-redis/v9"
)

// exerciseRedisStore sends, through client, every kind of request the
// Redis store makes, with the default key prefix: for each algorithm (and
// a calendar window) a take, a peek, a refund and a reset, each of whose
// decisions must be what it is on a fresh key; the scripts loaded first,
// as the warm start does; leases whose unspent units go back in a batch,
// as a near cache gives them back when it closes; a renewal; the renewal of a concurrency
// slot; and runtime overrides (exerciseRedisOverrides). It returns the
// first error, naming the operation, so the TLS and ACL tests can check
// what a refused connection or command says.
func exerciseRedisStore(ctx context.Context, client redis.UniversalClient) error {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		return err
	}
	policies := []limiter.Policy{
		{Algorithm: limiter.TokenBucket, Events: 4, Window: time.Minute},
		{Algorithm: limiter.LeakyBucket, Events: 4, Window: time.Minute},
		{Algorithm: limiter.FixedWindow, Events: 4, Window: time.Minute},
		{Algorithm: limiter.SlidingWindowLog, Events: 4, Window: time.Minute},
		{Algorithm: limiter.SlidingWindowCounter, Events: 4, Window: time.Minute},
		{Algorithm: limiter.Concurrency, Events: 4, Window: time.Minute},
		{Algorithm: limiter.FixedWindow, Events: 4, Calendar: &limiter.Calendar{Period: limiter.Day, Location: berlin}},
	}
	for _, p := range policies {
		name := string(p.Algorithm)
		if p.Calendar != nil {
			name = "calendar"
		}
		r, err := New(client, p, Options{Zone: "access-" + name, Timeout: 5 * time.Second})
		if err != nil {
			return err
		}
		step := func(op string, err error) error {
			if err != nil {
				return fmt.Errorf("%s %s: %w", name, op, err)
			}
			return nil
		}
		if err := step("preload", r.Preload(ctx)); err != nil {
			return err
		}
		d, err := r.Take(ctx, "k", 1)
		if err := step("take", err); err != nil {
			return err
		}
		if !d.Allowed || d.Remaining != 3 {
			return fmt.Errorf("%s take: %+v, want allowed with 3 left", name, d)
		}
		if _, err := r.Peek(ctx, "k"); step("peek", err) != nil {
			return step("peek", err)
		}
		if p.Algorithm != limiter.LeakyBucket { // a leaky bucket's admissions are not refunded
			var back limiter.Decision
			if back, err = r.GiveBack(ctx, "k", 1, d.Receipt); step("refund", err) != nil {
				return step("refund", err)
			}
			if back.Remaining != 4 {
				return fmt.Errorf("%s refund: %+v, want 4 left", name, back)
			}
		}
		if p.Algorithm == limiter.Concurrency {
			if _, err := r.Take(ctx, "slot", 1); step("take a slot", err) != nil {
				return step("take a slot", err)
			}
			if err := step("renew slots", r.renewSlots(ctx)); err != nil {
				return err
			}
		}
		if _, err := r.Reset(ctx, "k"); step("reset", err) != nil {
			return step("reset", err)
		}
	}

	// Leases: a lease taken and renewed, and leases given back by the
	// batch script.
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	r, err := New(client, p, Options{Zone: "access-leases", Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	d, err := r.TakeUpTo(ctx, "renewed", 1, 10)
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	if _, err := r.Renew(ctx, limiter.Return{Key: "renewed", Units: 4, Taken: d.Receipt}, 1, 10); err != nil {
		return fmt.Errorf("lease renewal: %w", err)
	}
	// Leases of three keys returned together, in a batch, as a near
	// cache returns what its leases left when it closes.
	var returns []limiter.Return
	for _, key := range []string{"a", "b", "c"} {
		l, err := r.TakeUpTo(ctx, key, 1, 5)
		if err != nil {
			return fmt.Errorf("lease: %w", err)
		}
		returns = append(returns, limiter.Return{Key: key, Units: l.Granted() - 1, Taken: l.Receipt})
	}
	if err := r.ReturnMany(ctx, returns); err != nil {
		return fmt.Errorf("give-back of leases: %w", err)
	}
	for _, key := range []string{"a", "b", "c"} {
		d, err := r.Peek(ctx, key)
		if err != nil {
			return fmt.Errorf("peek after the give-back: %w", err)
		}
		if d.Remaining != 99 {
			return fmt.Errorf("%s after the give-back: %+v, want 99 left", key, d)
		}
	}
	return exerciseRedisOverrides(ctx, client)
}

package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestChargeGiveBackAcrossResetRedis is the Redis half of limiter's
// TestChargeReceiptNamesItsState (storetest.RunChargeReceiptCases): a
// charge's receipt names its state, so a give-back by it after an admin
// reset is dropped.
func TestChargeGiveBackAcrossResetRedis(t *testing.T) {
	storetest.RunChargeReceiptCases(t, redisCaseStore(redistest.Start(t).Client(t)))
}

// TestRedisMatchesMemoryAcrossResets is TestRedisMatchesMemory's
// comparison, decision for decision, with what it leaves out: admin
// resets between the steps, and give-backs of admissions taken before a
// reset (of either state, old or fresh). Charges are taken but their
// receipts are not given back here (TestChargeGiveBackAcrossResetRedis
// covers them), so what differs is the epochs' handling alone.
func TestRedisMatchesMemoryAcrossResets(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	policies := []limiter.Policy{
		{Algorithm: limiter.TokenBucket, Events: 7, Window: 24 * time.Hour, Burst: 13},
		{Algorithm: limiter.TokenBucket, Events: 999_983, Window: time.Hour, Burst: 100},
		{Algorithm: limiter.LeakyBucket, Events: 13, Window: 7 * time.Second},
		{Algorithm: limiter.FixedWindow, Events: 9, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.SlidingWindowLog, Events: 9, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.SlidingWindowCounter, Events: 11, Window: 1234567 * time.Microsecond},
		{Algorithm: limiter.Concurrency, Events: 3, Window: time.Hour},
		{Algorithm: limiter.TokenBucket, Events: 10_000_019, Window: 3 * time.Microsecond, Burst: 6},
		{Algorithm: limiter.FixedWindow, Events: 9, Calendar: &limiter.Calendar{Period: limiter.Day, Location: testutil.MustLoad(t, "Europe/Berlin")}},
	}
	for i, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(uint64(i), seed))
				mem, red, clock, now, span, maxCost := newStoreDiff(t, client, p, fmt.Sprintf("rdiff%d-%d", i, seed))
				var memTaken, redTaken []limiter.Admission
				var costs []int64
				leasing := p.Algorithm.Traits().Leases
				var log []string
				for step := range 200 {
					now = stepDiffClock(rng, clock, now, span)
					var dm, dr limiter.Decision
					var errm, errr error
					switch r := rng.IntN(10); {
					case r == 0:
						_, errm = mem.Reset(ctx, "k")
						_, errr = red.Reset(ctx, "k")
						if errm == nil && errr == nil {
							dm, errm = mem.Peek(ctx, "k")
							dr, errr = red.Peek(ctx, "k")
						}
						log = append(log, "reset")
					case r <= 3 && len(memTaken) > 0:
						j := rng.IntN(len(memTaken))
						dm, errm = mem.GiveBack(ctx, "k", costs[j], memTaken[j].Receipt)
						dr, errr = red.GiveBack(ctx, "k", costs[j], redTaken[j].Receipt)
						log = append(log, fmt.Sprintf("give back %d (epochs m%d r%d)", costs[j], memTaken[j].Receipt.Epoch, redTaken[j].Receipt.Epoch))
						memTaken = append(memTaken[:j], memTaken[j+1:]...)
						redTaken = append(redTaken[:j], redTaken[j+1:]...)
						costs = append(costs[:j], costs[j+1:]...)
					case r == 4 && p.Algorithm.Traits().Charges:
						cost := 1 + rng.Int64N(p.MaxCost())
						var am, ar limiter.Admission
						am, errm = mem.Charge(ctx, "k", cost)
						ar, errr = red.Charge(ctx, "k", cost)
						dm, dr = am.Decision, ar.Decision
						log = append(log, fmt.Sprintf("charge %d", cost))
					default:
						cost := 1 + rng.Int64N(maxCost)
						var am, ar limiter.Admission
						if leasing && rng.IntN(3) == 0 {
							want := cost + rng.Int64N(3*maxCost)
							am, errm = mem.TakeUpTo(ctx, "k", cost, want)
							ar, errr = red.TakeUpTo(ctx, "k", cost, want)
							cost = am.Granted()
							log = append(log, fmt.Sprintf("lease %d want %d: %v", cost, want, am.Allowed))
						} else {
							am, errm = mem.Take(ctx, "k", cost)
							ar, errr = red.Take(ctx, "k", cost)
							log = append(log, fmt.Sprintf("take %d: %v", cost, am.Allowed))
						}
						if am.Allowed && ar.Allowed {
							memTaken, redTaken, costs = append(memTaken, am), append(redTaken, ar), append(costs, cost)
						}
						dm, dr = am.Decision, ar.Decision
					}
					if errm != nil || errr != nil {
						t.Fatalf("seed %d step %d: %v %v", seed, step, errm, errr)
					}
					if dm.Allowed != dr.Allowed || dm.Remaining != dr.Remaining || dm.ResetAfter != dr.ResetAfter || dm.RetryAfter != dr.RetryAfter {
						t.Fatalf("seed %d step %d at %dus: memory %+v, redis %+v; last steps %q", seed, step, now, dm, dr, log[max(0, len(log)-8):])
					}
				}
			}
		})
	}
}

package limiter

import (
	"context"
	"testing"
	"time"
)

// TestReviewErrorReplyWaitsForProbePastTimeout: a decision that fails with
// an error reply makes ServerClock.refusedTime probe every shard (every
// Cluster master) under its lock, with a context that drops the decision's
// deadline and waits up to probeTimeout (1s). With one shard stalled, a
// decision on another shard that meets an error reply (here OOM, that
// shard being full; CLUSTERDOWN on a Cluster with a stalled master, ...)
// is held for the whole second instead of failing within the store's
// timeout, and every other failing decision queues behind it on the
// lock. The README promises a decision takes at most timeout × 9/8 before
// the fail mode applies.
func TestReviewErrorReplyWaitsForProbePastTimeout(t *testing.T) {
	shards := startShards(t, 2)
	ring := shards.ring(t)
	ctx := context.Background()
	const timeout = 20 * time.Millisecond
	r := newTestRedis(t, ring, Policy{Algorithm: TokenBucket, Events: 10, Window: time.Hour},
		RedisOptions{Zone: "probe", Timeout: timeout})
	if err := r.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	key := r.Key("k")
	for _, s := range shards {
		if s.Addr() == r.shardOf(key) {
			// The key's shard is full: the script's write fails with
			// an OOM error reply at once.
			if err := s.Client(t).ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			s.Pause()
			defer s.Resume()
		}
	}
	start := time.Now()
	_, err := r.Take(ctx, "k", 1)
	took := time.Since(start)
	if err == nil {
		t.Fatal("decided on a full shard")
	}
	if took > 25*timeout {
		t.Errorf("a decision with a %v timeout that met an error reply took %v (%v): it waited for a TIME probe of the stalled shard", timeout, took.Round(time.Millisecond), err)
	}
}

package nearcache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// sameShardKey is a key other than key in key's shard of cache.
func sameShardKey(t *testing.T, cache *Cache, key string) string {
	t.Helper()
	for i := range 10_000 {
		other := fmt.Sprint("other", i)
		if cache.shardIndex(other) == cache.shardIndex(key) {
			return other
		}
	}
	t.Fatal("no key shares the shard")
	return ""
}

// waitWriterPending waits until a writer (an admin reset) waits for sh's
// backs lock, which readers hold: TryRLock then fails.
func waitWriterPending(t *testing.T, sh *nearShard) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for sh.backs.TryRLock() {
		sh.backs.RUnlock()
		if time.Now().After(deadline) {
			t.Fatal("the reset never waited for the shard's give-backs")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNearCacheGroupAnsweredBeforeLeftDuringReset: settle answers every
// requester of its groups before it runs the left asks' callbacks. It
// delivered a group's answers in turn on one goroutine, and an ask whose
// requester left, answered after Close, gives its lease back right there
// (refillAnswer.take → giveBackNow), which takes its shard's backs lock
// for reading. When an admin reset of a key of that shard already waits
// for the lock (for another ask of the same group, a renewal, which holds
// it until its answer is settled), RWMutex's writer preference blocked the
// give-back behind the reset, the reset behind the renewal, and the
// renewal behind the give-back: the renewal's request and the reset never
// returned.
func TestNearCacheGroupAnsweredBeforeLeftDuringReset(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	store := &gatedBatcher{LeaseBatcher: newTestMemory(t, p, clock)}
	queued := make(queueWatch, 16)
	cache := openCache(t, store, p, Options{LeaseFraction: 0.5, Clock: clock, manualSweep: true, queued: queued.hook})

	// "renewed" holds a lease of 2 with 1 unit left: its next request of 3
	// is a renewal, which holds its shard's backs lock while it waits.
	for range 2 {
		if d, err := cache.Take(ctx, "renewed", 1); err != nil || !d.Allowed {
			t.Fatalf("take: %+v, %v", d, err)
		}
	}
	leaver := sameShardKey(t, cache, "renewed")

	store.arm()
	first := takeAsync(ctx, cache, "first", 1)
	store.waitCalled(t, "the first request never reached the store")
	leaving, leave := context.WithCancel(ctx)
	left := takeAsync(leaving, cache, leaver, 1)
	queued.wait(t, 1)
	renewal := takeAsync(ctx, cache, "renewed", 3)
	queued.wait(t, 1)
	leave()
	if r := <-left; r.err == nil {
		t.Fatalf("the request that left: %+v; want its context's error", r.d)
	}

	closing, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = cache.Close(closing)
	reset := resetAsync(ctx, cache, "renewed")
	waitWriterPending(t, cache.shard("renewed"))

	close(store.release)
	<-first
	select {
	case r := <-renewal:
		if r.err != nil {
			t.Fatalf("renewal: %v", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: the renewal queued behind the request that left never got its answer (settle blocked giving back under a pending reset)")
	}
	select {
	case err := <-reset:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: the reset never ran")
	}
}

package nearcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestNearCacheCloseMidFlightStress: requests over a few keys, some
// leaving while queued, groups failing at times, admin resets and lease
// returns, and Close mid-flight: Close returns (no refill left uncounted,
// no give-back stuck behind a reset) and nothing panics.
func TestNearCacheCloseMidFlightStress(t *testing.T) {
	for run := 0; run < 60; run++ {
		cache, store, _, _ := gatedWindow(t, 1<<16)
		rng := rand.New(rand.NewPCG(uint64(run), 9))
		var wg sync.WaitGroup
		for i := 0; i < 40; i++ {
			key := fmt.Sprintf("k%d", rng.IntN(6))
			cost := 1 + rng.Int64N(3)
			leaveAfter := time.Duration(rng.IntN(300)) * time.Microsecond
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), leaveAfter)
				defer cancel()
				for j := 0; j < 5; j++ {
					cache.Take(ctx, key, cost)
				}
			})
		}
		for i := 0; i < 4; i++ {
			key := fmt.Sprintf("k%d", rng.IntN(6))
			// Admin resets and lease returns: a reset waits for its shard's
			// give-backs, among them left renewals' (settle).
			reset := rng.IntN(2) == 0
			wg.Go(func() {
				for j := 0; j < 5; j++ {
					if reset {
						cache.Reset(context.Background(), key)
					} else {
						cache.ReturnLease(context.Background(), key)
					}
					time.Sleep(20 * time.Microsecond)
				}
			})
		}
		if rng.IntN(2) == 0 {
			store.mu.Lock()
			store.failGroups = true
			store.mu.Unlock()
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := cache.Close(ctx); err != nil {
			t.Fatalf("run %d: Close: %v", run, err)
		}
		cancel()
		wg.Wait()
	}
}

package nearcache

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// A left renewal's give-back lock is released by settle (nearAsk.unhold)
// before its left callback runs, and by the requester otherwise
// (refillAnswer.take). These tests check that it is released exactly
// once whatever happens to the ask, and that what the window between the
// release and the callback lets in (an admin reset of the key) leaves no
// unit stranded, credited to the fresh state, or spendable after it.

// renewable makes key hold a lease of 2 with 1 unit left, so its next
// request of more than 1 is a renewal: it holds its shard's backs lock
// for reading until its answer is settled. The store then counts 3.
func renewable(t *testing.T, cache *Cache, key string) {
	t.Helper()
	for range 2 {
		if d, err := cache.Take(context.Background(), key, 1); err != nil || !d.Allowed {
			t.Fatalf("take %s: %+v, %v", key, d, err)
		}
	}
	if units, _ := leaseOf(cache, key); units != 1 {
		t.Fatalf("%s holds %d units, want 1 left of a lease of 2", key, units)
	}
}

// leaseOf is key's nearKey in cache (nil if not remembered) and the units
// its current lease holds.
func leaseOf(cache *Cache, key string) (int64, *nearKey) {
	sh := cache.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[key]
	if k == nil {
		return 0, nil
	}
	return k.units, k
}

// waitSettled waits until k's refill under way has been answered (by its
// requester or by the left callback), failing after 5 s.
func waitSettled(t *testing.T, cache *Cache, key string, k *nearKey) {
	t.Helper()
	sh := cache.shard(key)
	deadline := time.Now().Add(5 * time.Second)
	for {
		sh.mu.Lock()
		busy := k.refill != nil
		sh.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's refill was never answered", key)
		}
		time.Sleep(time.Millisecond)
	}
}

// backsFree fails t unless no shard's backs lock is held (a reader never
// released shows as a failed TryLock).
func backsFree(t *testing.T, cache *Cache) {
	t.Helper()
	for i := range cache.shards {
		sh := &cache.shards[i]
		if !sh.backs.TryLock() {
			t.Fatalf("shard %d's give-back lock is still held", i)
		}
		sh.backs.Unlock()
	}
}

// TestNearCacheLeftRenewalResetBetweenUnholdAndLeft: settle releases a
// left renewal's give-back lock before running its left callback, so an
// admin reset of the key can run in between (here while the callback of
// an earlier left ask of the same group is busy). The renewal's grant
// was taken from the state the reset erased: the callback must neither
// keep it as the key's lease (spent after the reset, beside the fresh
// limit) nor give it back into the fresh state.
func TestNearCacheLeftRenewalResetBetweenUnholdAndLeft(t *testing.T) {
	ctx := context.Background()
	// The refused key's left callback asks for reclaims: it stops there
	// until the test has reset the renewed key.
	inCallback, proceed := make(chan struct{}), make(chan struct{})
	var giveBackErrors atomic.Int32
	cache, store, queued, mem := gatedWindow(t, 16, func(o *Options) {
		o.Name = func(key string) string { return key }
		o.Reclaim = func(string) {
			close(inCallback)
			<-proceed
		}
		o.OnGiveBackError = func(error) { giveBackErrors.Add(1) }
	})

	renewable(t, cache, "renewed")
	_, kRenewed := leaseOf(cache, "renewed")
	const refused = "refused"
	if d, err := mem.Take(ctx, refused, 100); err != nil || !d.Allowed {
		t.Fatalf("spending %s in the store: %+v, %v", refused, d, err)
	}

	first := busyLane(ctx, t, cache, &store.replyGate)
	leaveQueued(ctx, t, cache, queued, refused, true)
	close(store.release)
	<-first
	select {
	case <-inCallback:
	case <-time.After(5 * time.Second):
		t.Fatal("the refused key's left callback never ran")
	}

	// settle is in the first left callback; the renewal's lock is free.
	if !resetWithin(t, resetAsync(ctx, cache, "renewed")) {
		close(proceed)
		t.Fatal("the reset waited for a left renewal whose answer had come")
	}
	close(proceed)
	waitSettled(t, cache, "renewed", kRenewed)

	if d, err := mem.Peek(ctx, "renewed"); err != nil || d.Remaining != 100 {
		t.Fatalf("the store right after the reset and the renewal's answer: %+v, %v; want the fresh state, 100 left", d, err)
	}
	if units, k := leaseOf(cache, "renewed"); units != 0 || k == kRenewed {
		t.Fatalf("the cache kept %d units of the renewal's grant (same key %v) after the reset", units, k == kRenewed)
	}
	d, err := cache.Take(ctx, "renewed", 1)
	if err != nil || !d.Allowed || d.Source != limiter.SourceStore {
		t.Fatalf("the key's first request after the reset: %+v, %v; want a lease from the store", d, err)
	}
	if err := cache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := mem.Peek(ctx, "renewed"); err != nil || d.Remaining != 99 {
		t.Fatalf("the store after Close: %+v, %v; want 99 left (one admitted since the reset, nothing else)", d, err)
	}
	if n := giveBackErrors.Load(); n != 0 {
		t.Fatalf("%d give-back errors, want none", n)
	}
	backsFree(t, cache)
}

// TestNearCacheLeftRenewalInFailedGroup: a group the store fails, whose
// asks' requesters left, one of them a renewal: settle releases the
// renewal's give-back lock once (a second release panics, none blocks
// every later reset of its shard), reports the give-back that may not
// have reached the store once, and the key asks afresh.
func TestNearCacheLeftRenewalInFailedGroup(t *testing.T) {
	for _, requesterLeaves := range []bool{true, false} {
		t.Run(fmt.Sprintf("left=%v", requesterLeaves), func(t *testing.T) {
			ctx := context.Background()
			var giveBackErrors atomic.Int32
			cache, store, queued, _ := gatedWindow(t, 16, func(o *Options) {
				o.OnGiveBackError = func(error) { giveBackErrors.Add(1) }
			})
			renewable(t, cache, "renewed")
			_, kRenewed := leaseOf(cache, "renewed")
			other := sameShardKey(t, cache, "renewed")

			store.mu.Lock()
			store.failGroups = true
			store.mu.Unlock()
			first := busyLane(ctx, t, cache, &store.replyGate)
			renewal := leaveQueued(ctx, t, cache, queued, other, requesterLeaves)
			close(store.release)
			<-first
			if !requesterLeaves {
				if r := <-renewal; r.err == nil {
					t.Fatalf("the renewal of a failed group: %+v, %v; want the group's error", r.d, r.err)
				}
			}
			waitSettled(t, cache, "renewed", kRenewed)
			backsFree(t, cache)
			if n := giveBackErrors.Load(); n != 1 {
				t.Fatalf("%d give-back errors, want 1 (the renewal's unit)", n)
			}
			if !resetWithin(t, resetAsync(ctx, cache, "renewed")) {
				t.Fatal("the reset never ran")
			}
			if err := cache.Close(ctx); err != nil {
				t.Fatal(err)
			}
			backsFree(t, cache)
		})
	}
}

// TestNearCacheRenewalLeavesAsDelivered: a queued renewal whose context
// ends just as its group is delivered releases its give-back lock exactly
// once, by its requester or by settle, whichever took the answer: after
// Close no shard's lock is held, and each key's units in the store come
// to what its admitted requests spent (the renewal's give-back went in
// once, its grant is spent or given back, never both, never lost).
func TestNearCacheRenewalLeavesAsDelivered(t *testing.T) {
	both := leaveEachAsDelivered(t, 150, "r", 3, true)
	t.Logf("%d of 150 renewals got their answer, the rest left", both)
}

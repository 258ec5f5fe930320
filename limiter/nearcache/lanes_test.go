package nearcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// gatedBatcher is a shared store that takes leases in groups and, once
// armed, holds its next lone lease call (TakeUpTo, Renew) before the store
// sees it: a call under way for as long as the test wants. It records
// every group (LeaseMany) and fails them while failGroups is set.
type gatedBatcher struct {
	limiter.LeaseBatcher
	replyGate
	mu         sync.Mutex
	groups     [][]limiter.LeaseAsk
	alone      int
	failGroups bool
}

func (g *gatedBatcher) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	g.hold()
	g.mu.Lock()
	g.alone++
	g.mu.Unlock()
	return g.LeaseBatcher.TakeUpTo(ctx, key, cost, want)
}

func (g *gatedBatcher) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	g.hold()
	g.mu.Lock()
	g.alone++
	g.mu.Unlock()
	return g.LeaseBatcher.Renew(ctx, back, cost, want)
}

func (g *gatedBatcher) LeaseMany(ctx context.Context, asks []limiter.LeaseAsk) []limiter.LeaseAnswer {
	g.mu.Lock()
	g.groups = append(g.groups, append([]limiter.LeaseAsk(nil), asks...))
	fail := g.failGroups
	g.mu.Unlock()
	if fail {
		answers := make([]limiter.LeaseAnswer, len(asks))
		for i := range answers {
			answers[i].Err = errors.New("the store is down")
		}
		return answers
	}
	return g.LeaseBatcher.LeaseMany(ctx, asks)
}

// calls is how many lone lease calls and groups the store had.
func (g *gatedBatcher) calls() (alone int, groups [][]limiter.LeaseAsk) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.alone, append([][]limiter.LeaseAsk(nil), g.groups...)
}

// queueWatch is an Options.queued that counts the lease requests that
// joined a queue.
type queueWatch chan string

func (q queueWatch) hook(key string) { q <- key }

// wait waits for n requests to join a queue, failing after 5 s.
func (q queueWatch) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-q:
		case <-time.After(5 * time.Second):
			t.Fatal("a lease request never joined the queue")
		}
	}
}

// TestNearCacheGroupsLeases: while one lease request is under way, the
// requests of other keys queue, and when it returns they go to the store
// in one call (a renewal's give-back riding along), each answered with
// its own key's decision: a key's grant and remaining follow from its own
// request alone, so an answer delivered to another request shows. A lone
// request goes at once, by itself.
func TestNearCacheGroupsLeases(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	onEdgeBackends(t, p, func(t *testing.T, shared limiter.Leaser, clock *testutil.Clock) {
		cache, store, queued := gatedCache(t, shared.(limiter.LeaseBatcher), p, clock, 16)

		// A lone request, then another of the same key: a lease of 1,
		// then of 2, of which 1 is left for the renewal below.
		for range 2 {
			if d, err := cache.Take(ctx, "renewed", 1); err != nil || d.Source != limiter.SourceStore {
				t.Fatalf("take: %+v, %v; want the store's", d, err)
			}
		}
		if alone, groups := store.calls(); alone != 2 || len(groups) != 0 {
			t.Fatalf("two lone requests: %d lone calls and %d groups, want 2 and none", alone, len(groups))
		}

		first := busyLane(ctx, t, cache, &store.replyGate)
		keys := []string{"a", "b", "c", "d", "renewed"}
		results := make([]chan takeResult, len(keys))
		for i, key := range keys {
			cost := int64(1 + i%3)
			if key == "renewed" {
				cost = 3 // more than the unit its lease holds
			}
			results[i] = takeAsync(ctx, cache, key, cost)
		}
		queued.wait(t, len(keys))
		close(store.release)
		if r := <-first; r.err != nil || !r.d.Allowed || r.d.Remaining != 99 {
			t.Fatalf("first: %+v, %v; want admitted with 99 left", r.d, r.err)
		}
		for i, key := range keys {
			r := <-results[i]
			// A new key's lease is its cost; the renewal gives back
			// the unit left of a lease of 2 (3 taken so far) and
			// doubles it: 4, of which 1 is left once 3 are spent.
			cost := int64(1 + i%3)
			stored, held := 100-cost, int64(0)
			if key == "renewed" {
				cost, stored, held = 3, 100-3+1-4, 1
			}
			if r.err != nil || !r.d.Allowed || r.d.Source != limiter.SourceStore || r.d.Remaining != stored+held {
				t.Errorf("%s, cost %d: %+v, %v; want admitted by the store with %d left", key, cost, r.d, r.err, stored+held)
			}
			d, err := store.Peek(ctx, key)
			if err != nil || d.Remaining != stored {
				t.Errorf("%s in the store: %+v, %v; want %d left", key, d, err, stored)
			}
		}
		alone, groups := store.calls()
		if alone != 3 || len(groups) != 1 || len(groups[0]) != len(keys) {
			t.Fatalf("%d lone calls and groups %v; want 3 lone calls, then the %d queued requests in one group", alone, groups, len(keys))
		}
		for _, a := range groups[0] {
			if (a.Back.Units > 0) != (a.Key == "renewed") {
				t.Errorf("ask %+v: only the renewal gives units back", a)
			}
		}
	})
}

// gatedWindow is gatedCache over a memory store of a fixed window of 100
// an hour on a clock of its own, which it returns with them.
func gatedWindow(t *testing.T, queue int, more ...func(*Options)) (*Cache, *gatedBatcher, queueWatch, *limiter.Memory) {
	t.Helper()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 100, Window: time.Hour}
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	mem := newTestMemory(t, p, clock)
	cache, store, queued := gatedCache(t, mem, p, clock, queue, more...)
	return cache, store, queued, mem
}

// busyLane holds the lane of cache's leases busy: a request for "first"
// (cost 1) is held at gate until the test closes gate.release, so the
// requests that follow queue. Its answer comes on the channel.
func busyLane(ctx context.Context, t *testing.T, cache *Cache, gate *replyGate) chan takeResult {
	t.Helper()
	gate.arm()
	first := takeAsync(ctx, cache, "first", 1)
	gate.waitCalled(t, "the first request never reached the store")
	return first
}

// gatedCache is a cache leasing half of p's quota from store behind a
// gate (gatedBatcher: arm holds its next call), on clock, with no janitor,
// and the watch its queued requests report to (room for queue of them);
// more set further options.
func gatedCache(t *testing.T, store limiter.LeaseBatcher, p limiter.Policy, clock *testutil.Clock, queue int, more ...func(*Options)) (*Cache, *gatedBatcher, queueWatch) {
	t.Helper()
	gated := &gatedBatcher{LeaseBatcher: store}
	queued := make(queueWatch, queue)
	opts := Options{LeaseFraction: 0.5, Clock: clock, manualSweep: true, queued: queued.hook}
	for _, set := range more {
		set(&opts)
	}
	return openCache(t, gated, p, opts), gated, queued
}

// TestNearCacheGroupFails: a group the store fails fails each of its
// requests, as a failed call does alone, and each key asks afresh next
// time.
func TestNearCacheGroupFails(t *testing.T) {
	ctx := context.Background()
	cache, store, queued, _ := gatedWindow(t, 16)
	store.failGroups = true
	first := busyLane(ctx, t, cache, &store.replyGate)
	var results []chan takeResult
	for i := range 3 {
		results = append(results, takeAsync(ctx, cache, fmt.Sprint("k", i), 1))
	}
	queued.wait(t, 3)
	close(store.release)
	if r := <-first; r.err != nil || !r.d.Allowed {
		t.Fatalf("first: %+v, %v", r.d, r.err)
	}
	for i, done := range results {
		if r := <-done; r.err == nil {
			t.Errorf("k%d: %+v from a group the store failed", i, r.d)
		}
	}
	store.mu.Lock()
	store.failGroups = false
	store.mu.Unlock()
	for i := range 3 {
		if d, err := cache.Take(ctx, fmt.Sprint("k", i), 1); err != nil || !d.Allowed || d.Source != limiter.SourceStore || d.Remaining != 99 {
			t.Errorf("k%d afterwards: %+v, %v; want asked afresh, 99 left", i, d, err)
		}
	}
}

// TestNearCacheQueuedRequestLeaves: a request whose context ends while it
// waits in the queue fails at once; its lease request still goes, and
// what it brings becomes the key's lease, whole: the key's next request
// spends it without asking the store, and Close gives back the rest, so
// no unit is left taken and unclaimed.
func TestNearCacheQueuedRequestLeaves(t *testing.T) {
	cache, store, queued, mem := gatedWindow(t, 16)
	ctx := context.Background()
	first := busyLane(ctx, t, cache, &store.replyGate)
	leaving, leave := context.WithCancel(ctx)
	left := takeAsync(leaving, cache, "k", 2)
	queued.wait(t, 1)
	leave()
	select {
	case r := <-left:
		if r.err == nil || !errors.Is(r.err, context.Canceled) {
			t.Fatalf("the request that left: %+v, %v; want its context's error", r.d, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request whose context ended waited on")
	}
	close(store.release)
	if r := <-first; r.err != nil || !r.d.Allowed {
		t.Fatalf("first: %+v, %v", r.d, r.err)
	}
	// The lease the request that left asked for is the key's: 2 units.
	deadline := time.Now().Add(5 * time.Second)
	for units, _, _ := cache.lease("k"); units != 2; units, _, _ = cache.lease("k") {
		if time.Now().After(deadline) {
			t.Fatalf("the key holds %d units, want the 2 its request that left asked for", units)
		}
		time.Sleep(time.Millisecond)
	}
	alone, _ := store.calls()
	d, err := cache.Take(ctx, "k", 1)
	if err != nil || d.Source != limiter.SourceLease {
		t.Fatalf("the key's next request: %+v, %v; want spent from the lease", d, err)
	}
	if after, _ := store.calls(); after != alone {
		t.Fatalf("the key's next request asked the store")
	}
	if err := cache.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := mem.Peek(ctx, "k"); err != nil || d.Remaining != 99 {
		t.Fatalf("the store after Close: %+v, %v; want 99 left: one admitted, the rest given back", d, err)
	}
}

// TestNearCacheGroupsSplit: when more than a call's worth queued, they go
// in several calls of up to 64 operations, all at once: none waits for
// another group's call.
func TestNearCacheGroupsSplit(t *testing.T) {
	ctx := context.Background()
	cache, store, queued, _ := gatedWindow(t, 128)
	first := busyLane(ctx, t, cache, &store.replyGate)
	const n = 100
	var results []chan takeResult
	for i := range n {
		results = append(results, takeAsync(ctx, cache, fmt.Sprint("k", i), 1+int64(i%3)))
	}
	queued.wait(t, n)
	close(store.release)
	<-first
	for i, done := range results {
		if r := <-done; r.err != nil || !r.d.Allowed || r.d.Remaining != 100-1-int64(i%3) {
			t.Errorf("k%d: %+v, %v", i, r.d, r.err)
		}
	}
	_, groups := store.calls()
	var sizes []int
	for _, g := range groups {
		sizes = append(sizes, len(g))
	}
	if len(groups) != 2 || sizes[0]+sizes[1] != n || max(sizes[0], sizes[1]) != leaseBatchOps {
		t.Fatalf("groups of %v asks, want %d and %d", sizes, leaseBatchOps, n-leaseBatchOps)
	}
}

package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestPreloadFindsServerWithoutTime: on a server that refuses TIME in
// scripts, loading the scripts switches the stores of the client to the
// instance's clock before any decision, once for all of them, and every
// algorithm then decides, refunds, peeks and resets as it does on Redis's
// clock.
func TestPreloadFindsServerWithoutTime(t *testing.T) {
	s := redistest.StartArgs(t, redistest.WithoutTime...)
	client := s.Client(t)
	ctx := context.Background()
	var switches heard[bool]
	clock := NewServerClock(client, switches.add)
	storetest.AwayFromHourEnd()
	for alg, p := range redisPolicies(3, time.Hour) {
		r := newTestRedis(t, client, p, Options{Zone: "notime-" + string(alg), Timeout: time.Second, ServerClock: clock})
		if err := r.Preload(ctx); err != nil {
			t.Fatalf("%s: preload: %v", alg, err)
		}
		if !r.InstanceClock() {
			t.Fatalf("%s: after Preload on a server without TIME the store is not on the instance's clock", alg)
		}
		var last limiter.Admission
		for i := range 3 {
			d, err := r.Take(ctx, "k", 1)
			if err != nil || !d.Allowed || d.Remaining != int64(2-i) {
				t.Fatalf("%s: take %d: %+v %v, want allowed with %d remaining", alg, i+1, d, err, 2-i)
			}
			last = d
		}
		// A concurrency slot frees when a request ends, not with time:
		// its refusal names no wait.
		if d, err := r.Take(ctx, "k", 1); err != nil || d.Allowed || (d.RetryAfter <= 0) != (alg == limiter.Concurrency) {
			t.Fatalf("%s: take 4: %+v %v, want refused with a wait", alg, d, err)
		}
		if _, err := r.GiveBack(ctx, "k", 1, last.Receipt); err != nil {
			t.Fatalf("%s: refund: %v", alg, err)
		}
		if d, err := r.Peek(ctx, "k"); err != nil || d.Remaining != 1 {
			t.Fatalf("%s: peek after a refund: %+v %v, want 1 remaining", alg, d, err)
		}
		if had, err := r.Reset(ctx, "k"); err != nil || !had {
			t.Fatalf("%s: reset: %v %v", alg, had, err)
		}
	}
	if got := switches.got(); len(got) != 1 || !got[0] {
		t.Fatalf("the clock switched %v, want once, to the instance's", got)
	}
}

// TestServerClockFollowsTheServer: a store on a server that allows TIME
// decides by it; once the server refuses TIME (here an ACL rule, in
// production a failover to a server that refuses it) the next decision
// still succeeds, on the instance's clock, counting on from the same
// state; once the server allows TIME again, the NOSCRIPT of a server that
// lost its scripts brings the store back to Redis's clock. Leases given
// back in a batch and renewed (the batch script) follow the same clock.
func TestServerClockFollowsTheServer(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	var switches heard[bool]
	clock := NewServerClock(client, switches.add)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Hour}
	r := newTestRedis(t, client, p, Options{Zone: "follow", Timeout: time.Second, ServerClock: clock})
	take := func(when string, wantRemaining int64) limiter.Decision {
		t.Helper()
		d, err := r.Take(ctx, "k", 1)
		if err != nil || !d.Allowed || d.Remaining != wantRemaining {
			t.Fatalf("take %s: %+v %v, want allowed with %d remaining", when, d, err, wantRemaining)
		}
		return d.Decision
	}
	server := func(cmd ...any) {
		t.Helper()
		if err := client.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	take("on Redis's clock", 9)
	if r.InstanceClock() {
		t.Fatal("on a server that allows TIME the store is on the instance's clock")
	}

	// A probe just before the server changes (a failover right after a
	// reload) must not stop the first failed decision from probing again.
	if err := clock.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	server("ACL", "SETUSER", "default", "-time")
	server("SCRIPT", "FLUSH")
	take("once the server refuses TIME", 8)
	if !r.InstanceClock() {
		t.Fatal("the decision succeeded without TIME but the store is not on the instance's clock")
	}

	// The batch script: a lease renewed through another store, on a clock
	// of its own that has not yet met the refusal.
	other := newTestRedis(t, client, p, Options{Zone: "follow", Timeout: time.Second})
	lease, err := r.TakeUpTo(ctx, "k", 1, 3)
	if err != nil || !lease.Allowed || lease.Remaining != 5 {
		t.Fatalf("lease: %+v %v, want 3 granted, 5 remaining", lease, err)
	}
	d, err := other.Renew(ctx, limiter.Return{Key: "k", Units: 3, Taken: lease.Receipt}, 1, 2)
	if err != nil || !d.Allowed || d.Remaining != 6 {
		t.Fatalf("renew through a store that had not met the refusal: %+v %v, want 2 granted, 6 remaining", d, err)
	}
	if !other.InstanceClock() {
		t.Fatal("the batch script succeeded without TIME but its store is not on the instance's clock")
	}
	if err := other.ReturnMany(ctx, []limiter.Return{{Key: "k", Units: 2, Taken: d.Receipt}}); err != nil {
		t.Fatal(err)
	}

	server("ACL", "SETUSER", "default", "+time")
	time.Sleep(reprobeAfter) // a probe that soon after the last is skipped
	server("SCRIPT", "FLUSH")
	take("once the server allows TIME again", 7)
	deadline := time.Now().Add(5 * time.Second)
	for r.InstanceClock() {
		if time.Now().After(deadline) {
			t.Fatal("5s after a NOSCRIPT from a server that allows TIME again, the store is still on the instance's clock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	take("back on Redis's clock", 6)
	if got := switches.got(); len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("the clock switched %v, want to the instance's and back", got)
	}
}

// TestEveryInstanceGoesBackToRedisClock: once the server allows TIME
// again, every instance goes back to Redis's clock, not only the first to
// meet the NOSCRIPT of a failover (its EVAL loads the script, so the
// others' EVALSHA succeeds and they meet none): on the instance's clock a
// store asks again every recheckEvery. Before the fix, the
// other instances stayed on their own clocks for good.
//
// Two stores with a ServerClock each stand for two Caddy instances on one
// server; the ACL takes TIME away and gives it back, as in
// TestServerClockFollowsTheServer.
func TestEveryInstanceGoesBackToRedisClock(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	server := func(cmd ...any) {
		t.Helper()
		if err := admin.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Events: 100, Window: time.Hour}
	server("ACL", "SETUSER", "default", "-time")
	var stores []*Store
	for _, name := range []string{"first", "second"} {
		c := s.Client(t) // an instance's own client
		clock := NewServerClock(c, nil)
		clock.recheckEvery = reprobeAfter // not 10 s, in a test
		r := newPreloadedRedis(t, c, p, Options{Zone: "back", Timeout: time.Second, ServerClock: clock})
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

// TestErrorReplyProbesWithinTheTimeout: a decision that fails with an
// error reply asks only its own server whether it refuses TIME, within the
// decision's deadline, so a stalled shard elsewhere holds it up no longer
// than the store's timeout allows (docs/redis.md: at most timeout × 9/8 before
// the fail mode applies). Guards against: the probe asked every shard
// (every Cluster master) for up to a second, with one shard stalled, while
// every other failing decision queued behind it.
func TestErrorReplyProbesWithinTheTimeout(t *testing.T) {
	shards := startShards(t, 2)
	ring := shards.ring(t)
	ctx := context.Background()
	const timeout = 20 * time.Millisecond
	r := newPreloadedRedis(t, ring, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Hour},
		Options{Zone: "probe", Timeout: timeout})
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

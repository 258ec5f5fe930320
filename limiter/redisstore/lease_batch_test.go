package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestRedisLeaseMany takes the leases of 150 keys in one LeaseMany, each
// key asking for a different number of units and some renewing (a
// give-back first), on a standalone Redis, where they go 64 operations
// to a script call, on shards, where each shard's go to it alike, and on
// a Cluster, where each goes alone. Every answer must be its own key's:
// a key's grant and remaining follow from its own ask alone, so an answer
// delivered to another ask shows. A key holding a value Floodgate does
// not write fails its ask alone.
func TestRedisLeaseMany(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1000, Window: time.Hour}
	eachTopology(t, func(t *testing.T, client redis.UniversalClient) {
		r := newPreloadedRedis(t, client, p, Options{Zone: "group", Timeout: 5 * time.Second})
		const keys = 150
		asks := make([]limiter.LeaseAsk, keys)
		for i := range asks {
			key := fmt.Sprint("k", i)
			asks[i] = limiter.LeaseAsk{Key: key, Cost: 1 + int64(i%3), Want: 5 + int64(i)}
			if i%4 == 0 {
				// A renewal: a first lease of 20, of which 1 + i%7 go
				// back before the next lease.
				d, err := r.TakeUpTo(ctx, key, 1, 20)
				if err != nil || d.Granted() != 20 {
					t.Fatalf("first lease of %s: %+v, %v", key, d, err)
				}
				asks[i].Back = limiter.Return{Key: key, Units: 1 + int64(i%7), Taken: d.Receipt}
			}
		}
		const foreign = 77
		if err := client.Set(ctx, r.Key(asks[foreign].Key), "not floodgate's", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		// The operations each server runs: the standalone one's, or
		// each shard's, whose keys LeaseLane puts in a lane of its own.
		ops := map[*redis.Client]int64{}
		lanes := map[int]*redis.Client{}
		for _, a := range asks {
			var server *redis.Client
			switch c := client.(type) {
			case *redis.Client:
				server = c
			case *redis.Ring:
				var err error
				if server, err = c.GetShardClientForKey(r.Key(a.Key)); err != nil {
					t.Fatal(err)
				}
			case *redis.ClusterClient:
				if lane := r.LeaseLane(a.Key); lane >= 0 {
					t.Fatalf("LeaseLane(%s) on a Cluster: %d, want none (negative)", a.Key, lane)
				}
				continue
			}
			lane := r.LeaseLane(a.Key)
			if other, ok := lanes[lane]; ok && other != server {
				t.Fatalf("lane %d holds keys of %s and %s", lane, other.Options().Addr, server.Options().Addr)
			}
			lanes[lane] = server
			ops[server] += int64(1 + min(1, a.Back.Units))
		}
		if len(lanes) != len(ops) {
			t.Errorf("%d servers hold the keys, which LeaseLane puts in %d lanes", len(ops), len(lanes))
		}
		for c := range ops {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}

		answers := r.LeaseMany(ctx, asks)

		for c, n := range ops {
			calls, err := storetest.ScriptCalls(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			// Up to 64 operations a call, a renewal's two never split:
			// at most one call more than the fewest.
			if least := (n + redisMaxReturns - 1) / redisMaxReturns; calls < least || calls > least+1 {
				t.Errorf("%s: %d operations took %d script calls, want %d or %d", c.Options().Addr, n, calls, least, least+1)
			}
		}
		if len(answers) != keys {
			t.Fatalf("%d answers to %d asks", len(answers), keys)
		}
		for i, a := range asks {
			ans := answers[i]
			if i == foreign {
				if ans.Err == nil {
					t.Errorf("%s holds a foreign value, and its ask was answered: %+v", a.Key, ans.Admission)
				}
				continue
			}
			left := p.Events - a.Want
			if a.Back.Units > 0 {
				left = p.Events - 20 + a.Back.Units - a.Want
			}
			if ans.Err != nil || !ans.Allowed || ans.Granted() != a.Want || ans.Remaining != left {
				t.Fatalf("ask %d (%s, want %d, back %d): %+v, %v; want %d granted, %d left", i, a.Key, a.Want, a.Back.Units, ans.Admission, ans.Err, a.Want, left)
			}
			// The admission holds its grant, and gives it back to its key.
			if _, err := ans.GiveBack(ctx, ans.Held()); err != nil {
				t.Fatal(err)
			}
			d, err := r.Peek(ctx, a.Key)
			if want := left + a.Want; err != nil || d.Remaining != want {
				t.Fatalf("%s after its lease went back: %+v, %v; want %d left", a.Key, d, err, want)
			}
		}
	})
}

// TestRedisLeaseManyRefuses: an ask the policy cannot grant fails alone,
// before anything is sent, and so does one whose give-back names another
// key.
func TestRedisLeaseManyRefuses(t *testing.T) {
	s := redistest.Start(t)
	r := newTestRedis(t, s.Client(t), limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Hour}, Options{Zone: "refuse"})
	answers := r.LeaseMany(context.Background(), []limiter.LeaseAsk{
		{Key: "a", Cost: 1, Want: 2},
		{Key: "b", Cost: 11, Want: 11},
		{Key: "c", Cost: 2, Want: 1},
		{Key: "d", Cost: 1, Want: 1, Back: limiter.Return{Key: "e", Units: 1}},
		{Key: "f", Cost: 1, Want: 3},
	})
	for i, want := range []bool{true, false, false, false, true} {
		if ok := answers[i].Err == nil && answers[i].Allowed; ok != want {
			t.Errorf("ask %d: %+v, %v; want answered %v", i, answers[i].Admission, answers[i].Err, want)
		}
	}
	if g := answers[4].Granted(); g != 3 {
		t.Errorf("the last ask was granted %d, want 3", g)
	}
}

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

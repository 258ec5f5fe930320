package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestRedisConcurrencySlotsRenewed: a slot is held for as long as its
// request runs, however much longer than the window, as in the memory
// store; only a slot its instance stopped renewing lapses. Without
// renewal the slot of a request still running lapsed after the window,
// and a second request of the key got in.
func TestRedisConcurrencySlotsRenewed(t *testing.T) {
	s := redistest.Start(t)
	client := s.Client(t)
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.Concurrency, Events: 2, Window: time.Second}
	clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
	a := newTestRedis(t, client, p, Options{Zone: "slots", Timeout: 5 * time.Second, Clock: clock})
	b := newTestRedis(t, client, p, Options{Zone: "slots", Timeout: 5 * time.Second, Clock: clock})
	take := func(r *Store, want bool) limiter.Admission {
		t.Helper()
		d, err := r.Take(ctx, "k", 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("take: %+v, %v; want allowed %v", d, err, want)
		}
		return d
	}
	long := take(a, true)
	dead := take(b, true) // b will stop renewing it, as if b had died
	b.release(b.slotName(dead.Receipt.Slot))
	// Ten windows pass; a renews every third of one, b does not.
	for range 30 {
		clock.Advance(p.Window / 3)
		if err := a.renewSlots(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// b's slot has lapsed: one free, a's long request still holds its own.
	take(b, true)
	take(a, false)
	if _, err := a.GiveBack(ctx, "k", 1, long.Receipt); err != nil {
		t.Fatal(err)
	}
	if a.HeldSlots() != 0 {
		t.Errorf("a holds %d slots after its request finished", a.HeldSlots())
	}
	take(a, true)
}

// TestRedisConcurrencySlotsRenewedInRealTime runs the renewer itself,
// on standalone and Cluster, with Redis's clock: a request held 2.5
// windows keeps its slot, and once it finishes the renewer stops.
func TestRedisConcurrencySlotsRenewedInRealTime(t *testing.T) {
	for name, start := range map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) },
	} {
		t.Run(name, func(t *testing.T) {
			client := start(t)
			ctx := context.Background()
			p := limiter.Policy{Algorithm: limiter.Concurrency, Events: 1, Window: 400 * time.Millisecond}
			r := newTestRedis(t, client, p, Options{Zone: "slots-rt", Timeout: 5 * time.Second})
			held := make([]limiter.Admission, 0, 20)
			for i := range 20 { // slots on many keys, so a Cluster spreads them
				d, err := r.Take(ctx, string(rune('a'+i)), 1)
				if err != nil || !d.Allowed {
					t.Fatalf("take: %+v, %v", d, err)
				}
				held = append(held, d)
			}
			time.Sleep(5 * p.Window / 2)
			for i := range 20 {
				if d, err := r.Take(ctx, string(rune('a'+i)), 1); err != nil || d.Allowed {
					t.Fatalf("key %d: a second request got in while the first still runs: %+v, %v", i, d, err)
				}
			}
			for i, d := range held {
				if _, err := r.GiveBack(ctx, string(rune('a'+i)), 1, d.Receipt); err != nil {
					t.Fatal(err)
				}
			}
			testutil.Eventually(t, "the renewer stops once no slot is held", func() error {
				r.slots.mu.Lock()
				defer r.slots.mu.Unlock()
				if r.slots.stop != nil {
					return errors.New("still renewing")
				}
				return nil
			})
		})
	}
}

// BenchmarkRedisConcurrencyRenewal measures what renewing N held slots
// costs Redis: script calls per renewal, and per second per instance for a
// 1m window (a renewal every 20s). Each held request is on a key of its
// own, the costly case: requests of one key share a call's operation.
func BenchmarkRedisConcurrencyRenewal(b *testing.B) {
	s := redistest.Start(b)
	client := s.Client(b)
	ctx := context.Background()
	for _, held := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			p := limiter.Policy{Algorithm: limiter.Concurrency, Events: 10, Window: time.Minute}
			r := newTestRedis(b, client, p, Options{Zone: fmt.Sprintf("renew%d", held), Timeout: 5 * time.Second})
			for i := range held {
				if d, err := r.Take(ctx, strconv.Itoa(i), 1); err != nil || !d.Allowed {
					b.Fatalf("take: %+v, %v", d, err)
				}
			}
			before, err := storetest.ScriptCalls(ctx, client)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := r.renewSlots(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after, err := storetest.ScriptCalls(ctx, client)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(after-before)/float64(b.N), "scripts/renewal")
			b.ReportMetric(float64(after-before)/float64(b.N)/r.renewEvery().Seconds(), "scripts/s")
		})
	}
}

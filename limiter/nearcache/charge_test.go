package nearcache

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// TestChargeRefused: a store of an algorithm that cannot owe refuses a
// charge, as does any store a cost outside 1..MaxCost, with an error and
// without changing the key.
func TestChargeRefused(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	for _, a := range limiter.Algorithms {
		p := limiter.Policy{Algorithm: a, Events: 5, Window: time.Minute}
		mem, _ := storetest.NewMemory(t, p, limiter.MemoryOptions{})
		red := newTestRedis(t, client, p, redisstore.Options{Zone: "refused-" + string(a), Timeout: 5 * time.Second})
		stores := map[string]limiter.Charger{"memory": mem, "redis": red}
		if a.Traits().Leases {
			stores["near cache"] = openCache(t, red, p, Options{LeaseFraction: 1})
		}
		for name, s := range stores {
			costs := []int64{0, -1, p.MaxCost() + 1}
			if !a.Traits().Charges {
				costs = append(costs, 1)
			}
			for _, cost := range costs {
				if d, err := s.Charge(ctx, "k", cost); err == nil {
					t.Errorf("%s %s: a charge of %d was made: %+v", a, name, cost, d)
				}
			}
			if d, err := s.(limiter.Store).Peek(ctx, "k"); err != nil || d.Remaining != 5 {
				t.Errorf("%s %s: after refused charges the key has %d remaining (%v), want 5", a, name, d.Remaining, err)
			}
		}
	}
	// A near cache in front of a store that cannot charge says so.
	p := limiter.Policy{Algorithm: limiter.LeakyBucket, Events: 5, Window: time.Minute}
	red := newTestRedis(t, client, p, redisstore.Options{Zone: "refused-cache", Timeout: 5 * time.Second})
	cache := openCache(t, red, p, Options{DenyFor: time.Second})
	if _, err := cache.Charge(ctx, "k", 1); err == nil {
		t.Error("a near cache over a leaky bucket charged")
	}
}

// TestChargeExactAtTheBounds: at the largest policies the Redis store
// accepts, a debt of a whole quota on top of an empty state is kept and
// reported exactly by both stores, as the formulas give it: Lua's doubles
// stay within 2^53 (docs/design.md, "Exact integer arithmetic").
func TestChargeExactAtTheBounds(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	// W = 2^45 − 1 µs, the longest window, prime to 3; the token bucket's
	// 4×(B×W′ + L′) = 2^53 − 244 and the counter's 4×L×W = 2^53 − 256 sit
	// just inside the bound.
	const w = 1<<45 - 1
	window := time.Duration(w) * time.Microsecond
	type step struct {
		at      int64 // µs after the start, a window boundary
		op      string
		cost    int64
		allowed bool
		remain  int64
		reset   int64 // µs
		retry   int64 // µs
		charged int64 // for a charge
	}
	cases := []struct {
		p     limiter.Policy
		steps []step
	}{
		{
			// r = 3/W. Empty, then −B: debt 2×B×W, reset 2×B×W/3.
			limiter.Policy{Algorithm: limiter.TokenBucket, Events: 3, Window: window, Burst: 64},
			[]step{
				{0, "take", 64, true, 0, ceilDiv(64*w, 3), 0, 0},
				{0, "charge", 64, true, 0, ceilDiv(2*64*w, 3), 0, 64},
				{0, "charge", 64, true, 0, ceilDiv(2*64*w, 3), 0, 0},
				{0, "take", 1, false, 0, ceilDiv(2*64*w, 3), ceilDiv(65*w, 3), 0},
				// ⌈64W/3⌉ µs later the debt is 128W − 3×⌈64W/3⌉ = 64W − 2
				// (64W ≡ 1 mod 3): just short of empty.
				{ceilDiv(64*w, 3), "take", 1, false, 0, ceilDiv(64*w-2, 3), ceilDiv(w-2, 3), 0},
			},
		},
		{
			// Two windows: cur 2L, then prev 2L decaying.
			limiter.Policy{Algorithm: limiter.SlidingWindowCounter, Events: 64, Window: window},
			[]step{
				{0, "take", 64, true, 0, 2 * w, 0, 0},
				{0, "charge", 64, true, 0, 2 * w, 0, 64},
				{0, "charge", 1, true, 0, 2 * w, 0, 0},
				// Next window at y: 128×(W − y) ≤ 63×W, y = ⌈65W/128⌉.
				{0, "take", 1, false, 0, 2 * w, w + ceilDiv(65*w, 128), 0},
				{w, "take", 1, false, 0, w, ceilDiv(65*w, 128), 0},
				{w + ceilDiv(65*w, 128), "take", 1, true, 0, 2*w - ceilDiv(65*w, 128), 0, 0},
			},
		},
		{
			// The largest L the policy check allows with this W: 2×L×W < 2^61.
			limiter.Policy{Algorithm: limiter.FixedWindow, Events: 1 << 14, Window: window},
			[]step{
				{0, "take", 1 << 14, true, 0, w, 0, 0},
				{0, "charge", 1 << 14, true, 0, w, 0, 1 << 14},
				{0, "charge", 1, true, 0, w, 0, 0},
				{0, "take", 1, false, 0, w, w, 0},
				{w, "take", 1 << 14, true, 0, w, 0, 0},
			},
		},
	}
	for i, c := range cases {
		t.Run(c.p.String(), func(t *testing.T) {
			// A real epoch time on a window boundary, so absolute times
			// are as large as in production.
			start := (int64(1_800_000_000_000_000)/w + 1) * w
			clock := &testutil.Clock{}
			mem := newTestMemory(t, c.p, clock)
			red := newTestRedis(t, client, c.p, redisstore.Options{Zone: fmt.Sprintf("bounds%d", i), Timeout: 5 * time.Second, Clock: clock})
			for j, st := range c.steps {
				clock.SetMicro(start + st.at)
				for name, s := range map[string]interface {
					limiter.Store
					limiter.Charger
				}{"memory": mem, "redis": red} {
					var d limiter.Admission
					var err error
					if st.op == "charge" {
						d, err = s.Charge(ctx, "k", st.cost)
					} else {
						d, err = s.Take(ctx, "k", st.cost)
					}
					if err != nil {
						t.Fatalf("step %d %s: %v", j, name, err)
					}
					if d.Allowed != st.allowed || d.Remaining != st.remain || d.ResetAfter.Microseconds() != st.reset || d.RetryAfter.Microseconds() != st.retry ||
						(st.op == "charge" && d.Granted() != st.charged) {
						t.Fatalf("step %d %s %d %s: got allowed=%v remaining=%d reset=%dus retry=%dus granted=%d; want %v %d %dus %dus %d",
							j, st.op, st.cost, name, d.Allowed, d.Remaining, d.ResetAfter.Microseconds(), d.RetryAfter.Microseconds(), d.Granted(),
							st.allowed, st.remain, st.reset, st.retry, st.charged)
					}
				}
			}
		})
	}
}

// TestNearCacheChargePaysFromLease: a charge is paid from the key's lease
// first, with no call to the store, and the rest is taken from the store
// directly, past its limit; the key is then refused, and the store counts
// exactly what was spent and charged.
func TestNearCacheChargePaysFromLease(t *testing.T) {
	ctx := context.Background()
	clock := testutil.NewClock(time.UnixMicro(storetest.AlignedBase(limiter.Policy{Window: time.Minute})))
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}
	cache, store := newTestCache(t, p, clock, Options{LeaseFraction: 1})
	for range 4 { // leases of 1, 2 and 4: 7 taken, 4 spent, 3 left
		if d, err := cache.Take(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("take: %+v %v", d, err)
		}
	}
	d, err := cache.Charge(ctx, "k", 2)
	if err != nil || d.Source != limiter.SourceLease || d.Granted() != 2 || d.Remaining != 3+1 {
		t.Fatalf("charge the lease covers: %+v %v; want from the lease, 2 charged, 3 in the store and 1 in the lease", d, err)
	}
	if sd, _ := store.Memory.Peek(ctx, "k"); sd.Remaining != 3 {
		t.Fatalf("the store has %d left after a charge the lease paid, want 3", sd.Remaining)
	}
	d, err = cache.Charge(ctx, "k", 6) // 1 from the lease, 5 past the store's 3
	if err != nil || d.Source != limiter.SourceStore || d.Granted() != 6 || d.Remaining != 0 {
		t.Fatalf("charge past the lease: %+v %v; want 6 charged, none remaining", d, err)
	}
	if units, _, _ := cache.lease("k"); units != 0 {
		t.Fatalf("the lease holds %d units after paying a charge, want 0", units)
	}
	if d, _ := cache.Take(ctx, "k", 1); d.Allowed {
		t.Fatalf("a take was admitted while the key owes: %+v", d)
	}
	// 4 taken and 8 charged: the store's count is 12, so a refund of 3
	// leaves it at 9, one unit free.
	if sd, _ := store.Memory.GiveBack(ctx, "k", 3, d.Receipt); sd.Remaining != 1 {
		t.Fatalf("the store has %d left after giving 3 of its 12 back, want 1", sd.Remaining)
	}
	clock.Advance(time.Minute)
	if d, _ := cache.Take(ctx, "k", 10); !d.Allowed {
		t.Fatalf("the next window still owes: %+v", d)
	}
}

// TestPartialRefundThroughNearCache: the root gives back the part of an
// admission a response did not cost. Through a near cache, a part given
// back into the lease and a part given back to the store after the lease
// lapsed leave the store as if only the net units had been taken, for
// every algorithm that leases, over memory and Redis.
func TestPartialRefundThroughNearCache(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow, limiter.SlidingWindowLog, limiter.SlidingWindowCounter} {
		for _, backend := range []string{"memory", "redis"} {
			t.Run(string(a)+"/"+backend, func(t *testing.T) {
				p := limiter.Policy{Algorithm: a, Events: 100, Window: time.Hour}
				clock := testutil.NewClock(time.UnixMicro(storetest.AlignedBase(p) + 1000))
				ref := newTestMemory(t, p, clock)
				var shared limiter.Leaser
				if backend == "memory" {
					shared = newTestMemory(t, p, clock)
				} else {
					shared = newTestRedis(t, client, p, redisstore.Options{Zone: "partial-" + string(a), Timeout: 5 * time.Second, Clock: clock})
				}
				cache := openCache(t, shared, p, Options{LeaseFraction: 1, Clock: clock, manualSweep: true})
				for range 4 { // leases of 1, 2 and 4: 3 units left
					if d, err := cache.Take(ctx, "k", 1); err != nil || !d.Allowed {
						t.Fatalf("take: %+v %v", d, err)
					}
				}
				d, err := cache.Take(ctx, "k", 3)
				if err != nil || !d.Allowed || d.Source != limiter.SourceLease {
					t.Fatalf("take of 3 from the lease: %+v %v", d, err)
				}
				if _, err := cache.GiveBack(ctx, "k", 2, d.Receipt); err != nil {
					t.Fatal(err)
				}
				if units, _, _ := cache.lease("k"); units != 2 {
					t.Fatalf("the lease holds %d units after 2 of 3 came back, want 2", units)
				}
				if _, err := ref.Take(ctx, "k", 4); err != nil { // the net: 4 + 3 − 2 − 1
					t.Fatal(err)
				}
				clock.Advance(limiter.LeaseLifetime + limiter.LeaseLifetime/2)
				cache.sweep(false)
				cache.givingBack.Wait()
				if _, err := cache.GiveBack(ctx, "k", 1, d.Receipt); err != nil {
					t.Fatal(err)
				}
				got, err := shared.Peek(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				want, _ := ref.Peek(ctx, "k")
				// The sliding log logged the lease a lifetime ahead, so its
				// entries outlive the net take's by that much.
				if got.Remaining != want.Remaining || (a != limiter.SlidingWindowLog && got.ResetAfter != want.ResetAfter) {
					t.Fatalf("after partial refunds the store has remaining %d reset %v; taking the net 4 leaves %d, %v",
						got.Remaining, got.ResetAfter, want.Remaining, want.ResetAfter)
				}
			})
		}
	}
}

// TestNearCacheChargeAcrossInstances: three instances with leases take and
// charge one key concurrently on a real Redis (standalone and Cluster).
// Takes never pass more than the limit whatever the charges; and once the
// leases are back, Redis counts exactly the units taken plus those
// charged: the overdraft is what the charges took past the limit, and no
// charged unit is lost or counted twice, leases or not.
func TestNearCacheChargeAcrossInstances(t *testing.T) {
	onInstanceRedises(t, 3, func(t *testing.T, clients []redis.UniversalClient) {
		for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowLog, limiter.SlidingWindowCounter} {
			t.Run(string(alg), func(t *testing.T) {
				checkChargeAccuracy(t, clients, limiter.Policy{Algorithm: alg, Events: 100, Window: time.Hour})
			})
		}
	})
}

func checkChargeAccuracy(t *testing.T, clients []redis.UniversalClient, p limiter.Policy) {
	ctx := context.Background()
	caches, stores := instanceCaches(t, clients, p, "charge-accuracy", 0.2)
	key := fmt.Sprintf("k-%d", time.Now().UnixNano())
	var admitted, charged atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			cache := caches[i%len(caches)]
			if i%30 == 7 { // 10 charges of 9 units
				d, err := cache.Charge(ctx, key, 9)
				if err != nil {
					t.Error(err)
					return
				}
				charged.Add(d.Granted())
				return
			}
			d, err := cache.Take(ctx, key, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	for _, cache := range caches {
		if err := cache.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	count := redisCount(t, clients[0], stores[0], key)
	t.Logf("%d taken, %d charged; Redis counts %d", admitted.Load(), charged.Load(), count)
	if admitted.Load() > p.Events {
		t.Errorf("%d units taken, limit %d", admitted.Load(), p.Events)
	}
	if charged.Load() != 90 {
		t.Errorf("%d units charged, want all 90 (the debt stays within its cap)", charged.Load())
	}
	if count != admitted.Load()+charged.Load() {
		t.Errorf("Redis counts %d units, but %d were taken and %d charged", count, admitted.Load(), charged.Load())
	}
}

// redisCount reads the units a window algorithm's Redis state counts for
// key in the current window, through client, r's: the count, the sliding
// counter's cur (each before the state's "@epoch"), the sliding log's
// length less its epoch (lua/sliding_window_log.lua).
func redisCount(t *testing.T, client redis.UniversalClient, r *redisstore.Store, key string) int64 {
	t.Helper()
	ctx := context.Background()
	name := r.Key(key)
	if r.Policy().Algorithm == limiter.SlidingWindowLog {
		n, err := client.LLen(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		return max(0, n-1)
	}
	v, err := client.Get(ctx, name).Result()
	if err != nil {
		t.Fatal(err)
	}
	v, _, _ = strings.Cut(v, "@")
	parts := strings.Split(v, ":")
	n, err := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	return n
}

// TestNearCacheRenewalSeesDebt: a charge on one instance reaches the store
// at once; another instance may still spend the units its lease holds (the
// store counted them before the charge), but the renewal of its lease gives
// its leftover back and is refused while the key owes.
func TestNearCacheRenewalSeesDebt(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}
	clock := testutil.NewClock(time.UnixMicro(storetest.AlignedBase(p)))
	shared := newTestMemory(t, p, clock)
	caches := make([]*Cache, 2)
	for i := range caches {
		caches[i] = openCache(t, shared, p, Options{LeaseFraction: 1, Clock: clock, manualSweep: true})
	}
	holder, charger := caches[0], caches[1]
	for range 4 { // leases of 1, 2 and 4: the store counts 7, 3 held
		if d, _ := holder.Take(ctx, "k", 1); !d.Allowed {
			t.Fatalf("take refused: %+v", d)
		}
	}
	if d, err := charger.Charge(ctx, "k", 6); err != nil || d.Granted() != 6 || d.Remaining != 0 || d.Source != limiter.SourceStore {
		t.Fatalf("charge of 6 on the other instance: %+v %v; want all 6 from the store, none remaining", d, err)
	}
	if d, _ := holder.Take(ctx, "k", 1); !d.Allowed || d.Source != limiter.SourceLease {
		t.Fatalf("a unit the lease held was refused: %+v", d)
	}
	clock.Advance(limiter.LeaseLifetime) // the lease lapses with 2 units left
	d, err := holder.Take(ctx, "k", 1)
	if err != nil || d.Allowed {
		t.Fatalf("the renewal was granted while the key owes: %+v %v", d, err)
	}
	// The renewal gave the 2 back: 7 + 6 − 2 = 11, so 2 more back leave 1.
	if sd, _ := shared.GiveBack(ctx, "k", 2, d.Receipt); sd.Remaining != 1 {
		t.Fatalf("the store has %d left after 2 of its 11 came back, want 1", sd.Remaining)
	}
}

package ratelimit

// Tests of overrides in a redis zone's shared set: records other writers
// left there, and many instances' writes at once.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// TestOverrideRecordWithoutGenKeepsBareKeyState: a redis zone's override
// record written before overrides had generations has no "gen" (Gen 0),
// and its writer kept the key's state under the override limit by the
// bare key; this build names that state the same (StateKey of Gen 0), so
// an upgrade, or old and new instances side by side, keep counting in one
// state: the older instance spent the key's limit of 2 (a store of its
// own taking on the bare key, as that build's request path did), and this
// build admits no more within the hour. (The bug it guards against: Gen 0 was
// named key + NUL + "0", and this build admitted 2 more.)
func TestOverrideRecordWithoutGenKeepsBareKeyState(t *testing.T) {
	srv := redistest.Start(t)
	const name = "ov_gen0"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key {http.request.header.X-Key}", "algorithm fixed_window", "rate 10/1h", "store redis"), redisConfig(srv.Addr(), "timeout 1s")))
	var z *zone
	for _, zz := range h.zones {
		if zz.name == name {
			z = zz
		}
	}
	if z == nil || h.overrides == nil {
		t.Fatal("redis zone or its overrides not provisioned")
	}
	ctx := context.Background()
	const key = "gen0-key"
	// The record as 7b8d73f writes it: {"action":"limit","limit":2}, no gen.
	old := limiter.Override{Action: limiter.OverrideLimit, Events: 2}
	if err := h.overrides.Set(ctx, name, key, old); err != nil {
		t.Fatal(err)
	}
	// The older instance spends the key's limit under the bare key.
	older, err := redisstore.New(srv.Client(t), old.Policy(z.limit.policy), redisstore.Options{Zone: name, Override: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if d, err := older.Take(ctx, key, 1); err != nil || !d.Allowed {
			t.Fatalf("older instance's take %d: %+v %v", i+1, d, err)
		}
	}
	if d, _ := older.Take(ctx, key, 1); d.Allowed {
		t.Fatal("older instance admitted a third under 2/1h")
	}
	admitted := 0
	for i := 0; i < 2; i++ {
		r, _ := newKeyRequest("203.0.113.9", map[string]string{"X-Key": key})
		w, code := serve(h, r, okHandler)
		if code == 200 {
			admitted++
		}
		if i == 0 {
			t.Logf("this build's first request: %d, X-RateLimit-Limit %q", code, w.Header().Get("X-RateLimit-Limit"))
		}
	}
	if admitted > 0 {
		t.Fatalf("this build admitted %d more of a key whose limit of 2 an hour an older instance spent (its record has no gen: StateKey is key+\"\\x000\", not the bare key the older build counts under)", admitted)
	}
}

// TestOverrideForeignRecordBelowAPIFloorSkipped: a record in a redis
// zone's override set that the admin API would refuse (a window of 1µs,
// below the API's 1ms floor, though limiter.Override.Check accepts it) is
// not applied: the key is decided by the zone's own limit. (The bug it guards against:
// every instance applied it, "1 per microsecond", never limiting the key;
// nothing on the read path ran zone.checkOverride.)
func TestOverrideForeignRecordBelowAPIFloorSkipped(t *testing.T) {
	srv := redistest.Start(t)
	const name, key = "ov_foreign", "foreign-key"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key {http.request.header.X-Key}", "algorithm fixed_window", "rate 2/1h", "store redis"), redisConfig(srv.Addr(), "timeout 1s")))
	z := handlerZone(t, h, name)
	foreign := limiter.Override{Action: limiter.OverrideLimit, Events: 1, Window: time.Microsecond}
	if err := z.checkOverride(foreign); err == nil {
		t.Fatal("the admin API's check accepts a 1µs window: the premise is wrong")
	}
	// What a foreign writer (or a hand-made HSET of the same JSON,
	// {"action":"limit","limit":1,"window_us":1}) leaves in the set.
	if err := h.overrides.Set(context.Background(), name, key, foreign); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if o, ok := z.ov.lookup(key); ok && o.Window == time.Microsecond {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("the record never reached the table (skipped, as it should be?)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	admitted := 0
	var limit string
	for range 10 {
		r, _ := newKeyRequest("203.0.113.9", map[string]string{"X-Key": key})
		w, code := serve(h, r, okHandler)
		if code == 200 {
			admitted++
		}
		limit = w.Header().Get("X-RateLimit-Limit")
		time.Sleep(time.Millisecond)
	}
	if admitted > 2 {
		t.Fatalf("%d of 10 requests admitted in a zone of 2/1h, X-RateLimit-Limit %q: a stored override the admin API refuses (window 1µs) was applied instead of skipped", admitted, limit)
	}
}

// TestOverrideConcurrentPutsOfDifferentLimitsRedis: 24 PUTs of one key at
// once, each of a different limit, on a redis zone, 4 rounds: every one
// is answered 200. (The bug it guards against: SetGen gave up after 8 conditional
// writes refused by the others, and the admin API answered 502, the
// status of an unreachable Redis: 34 to 51 of 96 failed. A write other
// instances outrun 100 times is now answered 409.)
func TestOverrideConcurrentPutsOfDifferentLimitsRedis(t *testing.T) {
	srv := redistest.Start(t)
	const name, key = "ov_puts_at_once", "198.51.100.201"
	provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "algorithm fixed_window", "rate 10/1h", "store redis"), redisConfig(srv.Addr(), "timeout 1s")))
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, key, "") })
	var (
		mu     sync.Mutex
		failed = map[int]int{}
		total  int
	)
	for round := range 4 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 24 {
			total++
			wg.Go(func() {
				<-start
				body := fmt.Sprintf(`{"limit": %d}`, 1+round*100+i)
				if code, msg := adminOverride(t, http.MethodPut, name, key, body); code != 200 {
					mu.Lock()
					failed[code]++
					if len(failed) == 1 && failed[code] == 1 {
						t.Logf("PUT %s: %d %s", body, code, msg)
					}
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if len(failed) > 0 {
		t.Errorf("of %d PUTs of different limits at once, failed by status: %v", total, failed)
	}
}

package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestOverrideForeignRecordBelowAPIFloorSkipped: a record in a redis
// zone's override set that the admin API would refuse (a window of 1µs,
// below the API's 1ms floor, though limiter.Override.Check accepts it) is
// not applied: the key is decided by the zone's own limit. (Before its fix
// every instance applied it, "1 per microsecond", never limiting the key;
// nothing on the read path ran zone.checkOverride.)
func TestOverrideForeignRecordBelowAPIFloorSkipped(t *testing.T) {
	srv := redistest.Start(t)
	const name, key = "ov_acc_foreign", "foreign-key"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key {http.request.header.X-Key}
			algorithm fixed_window
			rate 2/1h
			store redis
		}
		redis {
			url redis://`+srv.Addr()+`
		}
	}`)
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

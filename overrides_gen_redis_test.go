package ratelimit

import (
	"context"
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
// build admits no more within the hour. (Found by a review: Gen 0 was
// named key + NUL + "0", and this build admitted 2 more.)
func TestOverrideRecordWithoutGenKeepsBareKeyState(t *testing.T) {
	srv := redistest.Start(t)
	const name = "ov_gen0"
	h := provisionHandler(t, `rate_limit {
		zone `+name+` {
			key {http.request.header.X-Key}
			algorithm fixed_window
			rate 10/1h
			store redis
		}
		redis {
			url redis://`+srv.Addr()+`
		}
	}`)
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

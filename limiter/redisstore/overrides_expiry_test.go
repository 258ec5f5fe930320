package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisOverrideFarExpiryKept: an override whose expiry is more
// than ~292 years away (Check and the admin API accept any RFC 3339 time
// after 1970) must be kept in Redis like any other. Set computes the set's
// TTL as Expires.Sub(now)+margin, where Sub saturates at the largest
// Duration and the margin then wraps it negative: the script's PEXPIRE of
// a negative time deletes the new set at once, so the override is gone
// from Redis (and from every other instance) while the writer applies it.
func TestRedisOverrideFarExpiryKept(t *testing.T) {
	s := redistest.Start(t)
	cfg := Config{Addresses: []string{s.Addr()}}
	a := newTestOverrides(t, redisClient(t, cfg), OverridesOptions{})
	a.zone(t, "far")
	o := limiter.Override{Action: limiter.OverrideBlock, Expires: time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC)}
	a.set(t, "far", "mallory", o)
	all, err := a.List(context.Background(), "far")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := all["mallory"]; !ok {
		t.Fatalf("an override expiring in 2400 is not in Redis after Set: List = %v", all)
	}
}

package redisstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestKeyNamesHashed: a Redis store names its keys by its KeyHasher, the
// keyed name in the hash tag (the Redis half of what was TestKeyHasher).
func TestKeyNamesHashed(t *testing.T) {
	const key = "203.0.113.7"
	secret := []byte("0123456789abcdef-secret")
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	want := hex.EncodeToString(mac.Sum(nil)[:16])
	h := limiter.NewKeyHasher(secret)
	srv := redistest.Start(t)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Events: 5, Window: time.Minute}
	r := newTestRedis(t, srv.Client(t), p, Options{Zone: "keyed", Keys: h, Timeout: time.Second})
	if _, err := r.Take(context.Background(), key, 1); err != nil {
		t.Fatal(err)
	}
	keys := scanKeys(t, srv.Client(t))
	if len(keys) != 1 || !strings.Contains(keys[0], "{"+want+"}") {
		t.Fatalf("keys %q, want one named by %s", keys, want)
	}
}

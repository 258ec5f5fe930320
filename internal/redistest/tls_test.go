package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
)

// TestTLSServer: a TLS server answers the harness's client, which shows
// the client certificate, and serves no plain TCP on its port; it
// survives a restart with a fresh certificate from the same CA.
func TestTLSServer(t *testing.T) {
	ca := testpki.NewCA(t, "redistest")
	s := StartTLS(t, TLS{CA: ca, Client: ca.Client(t, "harness")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Client(t).Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-TCP client got an answer from a TLS-only server")
	}
	s.Restart()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS after a restart: %v", err)
	}
}

// TestClusterTLS: a Cluster whose nodes serve TLS only forms, and a
// Cluster client with the harness's TLS writes keys of every master's
// slots, following the TLS ports the nodes announce.
func TestClusterTLS(t *testing.T) {
	ca := testpki.NewCA(t, "redistest")
	c := StartClusterTLS(t, 3, TLS{CA: ca, Client: ca.Client(t, "harness")})
	client := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := client.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
}

package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestServerLifecycle(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered while the server was paused")
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}

	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want an empty server", n, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	client := c.Client(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := client.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	info, err := client.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("cluster info: %v %s", err, info)
	}
}

func TestSentinel(t *testing.T) {
	s := StartSentinel(t)
	if s.MasterName == "" || s.Addr() == "" {
		t.Fatalf("sentinel without a master name or address: %+v", s)
	}
}

func TestPickServer(t *testing.T) {
	if c := pick("mongodb"); c.err == nil || c.name != "" {
		t.Fatalf("pick(mongodb) = %+v, want an error naming no server", c)
	}
	if c := pick("/nonexistent/valkey-server"); c.err == nil || c.name != "valkey-server" {
		t.Fatalf("pick of a missing path = %+v, want an error and the binary's name", c)
	}
	for _, value := range []string{"", "redis", "valkey"} {
		c := pick(value)
		if c.err != nil {
			t.Logf("%s=%q: %v", ServerEnv, value, c.err)
			continue
		}
		if !strings.Contains(c.name, "-server ") || c.cli == "" {
			t.Errorf("%s=%q: name %q, cli %q; want a server and version, and a client", ServerEnv, value, c.name, c.cli)
		}
		if abs := pick(c.bin); abs.err != nil || abs.name != c.name {
			t.Errorf("%s=%s: %+v, want %q as by name", ServerEnv, c.bin, abs, c.name)
		}
	}
}

// TestStartNeverTakesAnotherServer: a server started on a port that
// another server already holds (another test process got it first) fails
// to bind and exits; Start must not take the other one, which answers
// PING there, for its own.
func TestStartNeverTakesAnotherServer(t *testing.T) {
	other := Start(t)
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), port: other.Port(), args: func(s *Server) ([]string, error) {
		return []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", ""}, nil
	}}
	if err := s.launch(); err == nil {
		s.Stop()
		t.Fatalf("launched on %s, which another server holds: the other server's PING was taken for this one's", other.Addr())
	}
}

func TestPersistentKilledKeepsKeys(t *testing.T) {
	s := StartArgs(t, Persistent...)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after the kill")
	}
	s.Restart()
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("after kill and restart: %q %v, want the key written before the kill", v, err)
	}
	if ttl, err := c.TTL(ctx, "k").Result(); err != nil || ttl <= 0 || ttl > time.Minute {
		t.Fatalf("after kill and restart: TTL %v %v, want the key's expiry kept", ttl, err)
	}
}

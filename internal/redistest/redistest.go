// Package redistest starts real redis-server processes for tests: a
// standalone server, a Cluster, or a master with a replica behind Sentinel,
// each on free 127.0.0.1 ports with its own temporary directory, stopped by
// t.Cleanup. Tests of the Redis store run against the real server because the
// scripts, TTLs, slots and failure modes are what they test.
//
// Without redis-server on PATH the tests are skipped, unless the environment
// variable CI is "true": there a missing server fails loudly, so CI cannot
// pass without having run them.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/proc"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// startTimeout bounds how long a server may take to answer PING, and a
// Cluster or Sentinel to settle.
const startTimeout = 15 * time.Second

// pollInterval is how often readiness is polled.
const pollInterval = 10 * time.Millisecond

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args func(s *Server) ([]string, error) // the command line for s

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Binary returns the path of redis-server, skipping t when it is missing
// outside CI and failing t when it is missing under CI=true.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not on PATH (CI=true requires it): %v", err)
		}
		t.Skipf("redis-server is not on PATH: %v", err)
	}
	return bin
}

// Start starts a standalone server without persistence.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// start starts redis-server with extra arguments after the common ones.
func start(t testing.TB, extra []string) *Server {
	t.Helper()
	return startWith(t, func(s *Server) ([]string, error) {
		return append([]string{
			"--port", strconv.Itoa(s.port),
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--save", "",
			"--appendonly", "no",
			"--protected-mode", "yes",
			"--daemonize", "no",
			"--repl-diskless-sync-delay", "0",
		}, extra...), nil
	})
}

// startWith starts redis-server with the arguments args gives for a fresh
// port and directory, retrying with another port if the free port it picked
// was taken before the server could bind it. Restart reuses args.
func startWith(t testing.TB, args func(s *Server) ([]string, error)) *Server {
	t.Helper()
	bin := Binary(t)
	var last error
	for range 3 {
		s := &Server{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), args: args}
		if last = s.launch(); last == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", last)
	return nil
}

// launch starts the process on s.port and waits until it answers PING.
func (s *Server) launch() error {
	args, err := s.args(s)
	if err != nil {
		return err
	}
	return s.exec(args)
}

// exec runs redis-server with args, logging to a file in the server's
// directory, and waits for PING.
func (s *Server) exec(args []string) error {
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.port))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("creating log file: %w", err)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("running %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		if err := ping(s.Addr()); err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, tail(logPath))
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", s.port, startTimeout, tail(logPath))
		}
	}
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// Client returns a client of this server that honours context deadlines,
// closed by t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// Stop ends the server (continuing it first if it was paused) and waits
// for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	cmd, done := proc.Take(&s.mu, &s.cmd, &s.done)
	if cmd == nil {
		return
	}
	proc.Stop(cmd.Process, done, 5*time.Second, syscall.SIGCONT, syscall.SIGTERM)
}

// Pause stops the process with SIGSTOP: its port still accepts connections
// but nothing answers, as with a hung server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("signal %v: redis-server on port %d is not running", sig, s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v to redis-server on port %d: %v", sig, s.port, err)
	}
}

// Restart stops the server and starts it again on the same port with empty
// memory, as after a crash without persistence: keys and the script cache
// are gone.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for range 50 {
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(pollInterval)
	}
	s.t.Fatalf("restarting redis-server on port %d: %v", s.port, err)
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before redis-server binds it; start retries if so.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := testutil.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// ping sends PING over a fresh connection and checks that the server
// answers: PONG, or NOAUTH from one that requires a password.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	// A server that requires a password refuses PING, but it answers.
	if reply := string(buf[:n]); !strings.HasPrefix(reply, "+PONG") && !strings.HasPrefix(reply, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", reply)
	}
	return nil
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Masters []*Server
}

// Addrs are the masters' addresses, the seeds for a Cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, s := range c.Masters {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a Cluster client that honours context deadlines, closed
// by t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// StartCluster starts masters servers with cluster mode on, joins them
// with redis-cli --cluster create and waits until every node reports
// cluster_state:ok.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Binary(t) // skips or fails the same way a missing server does
		t.Fatalf("redis-cli is not on PATH: %v", err)
	}
	c := &Cluster{}
	for range masters {
		c.Masters = append(c.Masters, start(t, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(freePort(t)),
		}))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, s := range c.Masters {
		client := redis.NewClient(&redis.Options{Addr: s.Addr()})
		for {
			info, err := client.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				client.Close()
				t.Fatalf("cluster node %s not ok within %v: %v %s", s.Addr(), startTimeout, err, info)
			}
			time.Sleep(pollInterval)
		}
		client.Close()
	}
	return c
}

// Sentinel is a master and one replica watched by one Sentinel.
type Sentinel struct {
	Master, Replica, Sentinel *Server
	// MasterName is the name the Sentinel monitors the master under.
	MasterName string
	// Password is what the Sentinel requires of its clients (requirepass),
	// or empty. The master and replica require none.
	Password string
}

// Addr is the Sentinel's address, the one a failover client is given.
func (s *Sentinel) Addr() string { return s.Sentinel.Addr() }

// StartSentinel starts a master, a replica of it, and a Sentinel (run as
// redis-server <sentinel.conf> --sentinel, since Debian ships no separate
// redis-sentinel binary) monitoring the master as "floodgate-master", and
// waits until the replica is in sync and the Sentinel knows the master.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return StartSentinelAuth(t, "")
}

// StartSentinelAuth is StartSentinel with a Sentinel that requires
// password of its clients (none when it is empty).
func StartSentinelAuth(t testing.TB, password string) *Sentinel {
	t.Helper()
	const name = "floodgate-master"
	master := Start(t)
	replica := start(t, []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())})

	sentinel := startWith(t, func(s *Server) ([]string, error) {
		conf := filepath.Join(s.dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 5000\n",
			s.port, s.dir, name, master.Port(), name)
		if password != "" {
			body += "requirepass " + password + "\n"
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return nil, fmt.Errorf("writing sentinel.conf: %w", err)
		}
		return []string{conf, "--sentinel"}, nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr(), Password: password})
	defer sc.Close()
	for {
		repl, err1 := mc.Info(ctx, "replication").Result()
		addr, err2 := sc.GetMasterAddrByName(ctx, name).Result()
		synced := err1 == nil && strings.Contains(repl, "connected_slaves:1") && strings.Contains(repl, "state=online")
		known := err2 == nil && len(addr) == 2 && addr[1] == strconv.Itoa(master.Port())
		if synced && known {
			break
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("sentinel setup not ready within %v: replication %v %q, sentinel %v %v",
				startTimeout, err1, repl, err2, addr)
		}
		time.Sleep(pollInterval)
	}
	return &Sentinel{Master: master, Replica: replica, Sentinel: sentinel, MasterName: name, Password: password}
}

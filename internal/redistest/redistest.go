// Package redistest starts real redis-server processes for tests: a
// standalone server, a Cluster, or a master with a replica behind Sentinel,
// each on free 127.0.0.1 ports with its own temporary directory, stopped by
// t.Cleanup. Tests of the Redis store run against the real server because the
// scripts, TTLs, slots and failure modes are what they test.
//
// The environment variable FLOODGATE_REDIS_SERVER picks the server, so the
// same tests run against each server operators use: "redis" (or unset)
// runs redis-server, "valkey" runs valkey-server, and an absolute path runs
// that binary. Clusters are joined with the command-line client that
// matches (redis-cli, valkey-cli, or the <name>-cli beside the path).
//
// Without the server on PATH the tests are skipped, unless the environment
// variable CI is "true": there a missing server fails loudly, so CI cannot
// pass without having run them.
package redistest

import (
	"context"
	"crypto/tls"
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
	// tls is the harness's own connections' TLS, for a server that serves
	// TLS only; nil for one that serves plain TCP.
	tls *tls.Config

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// ServerEnv is the environment variable that picks the server the tests
// run against: "redis" (the default when unset), "valkey", or the absolute
// path of a server binary.
const ServerEnv = "FLOODGATE_REDIS_SERVER"

// serverChoice is the server binary and command-line client ServerEnv
// picks, found once per test binary.
type serverChoice struct {
	// bin and cli are paths, or empty with err saying why.
	bin, cli string
	err      error
	// name is "<binary> <version>", such as "valkey-server 8.0.1".
	name string
}

var (
	chosenOnce sync.Once
	chosen     serverChoice
)

// choice reads ServerEnv and finds the binaries it names, once.
func choice() serverChoice {
	chosenOnce.Do(func() { chosen = pick(os.Getenv(ServerEnv)) })
	return chosen
}

// pick finds the server and client binaries for a value of ServerEnv.
func pick(value string) serverChoice {
	var server, cli string
	switch {
	case value == "" || value == "redis":
		server, cli = "redis-server", "redis-cli"
	case value == "valkey":
		server, cli = "valkey-server", "valkey-cli"
	case filepath.IsAbs(value):
		server = value
		// The client is installed beside the server under the matching
		// name (valkey-server, valkey-cli); failing that, any on PATH.
		base := strings.TrimSuffix(filepath.Base(value), "-server")
		cli = filepath.Join(filepath.Dir(value), base+"-cli")
		if _, err := os.Stat(cli); err != nil {
			cli = "redis-cli"
			if _, err := exec.LookPath(cli); err != nil {
				cli = "valkey-cli"
			}
		}
	default:
		return serverChoice{err: fmt.Errorf(`%s=%q: want "redis", "valkey" or the absolute path of a server binary`, ServerEnv, value)}
	}
	c := serverChoice{name: filepath.Base(server)}
	var err error
	if c.bin, err = exec.LookPath(server); err != nil {
		c.err = fmt.Errorf("%s is not on PATH: %w", server, err)
		return c
	}
	// A missing client fails only what needs it (joining a Cluster).
	c.cli, _ = exec.LookPath(cli)
	if out, err := exec.Command(c.bin, "--version").Output(); err == nil {
		// "Redis server v=7.0.15 sha=..." or "Valkey server v=8.0.1 ...".
		for f := range strings.FieldsSeq(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				c.name += " " + v
			}
		}
	}
	return c
}

// ServerUnderTest is the server binary the tests run against and its version,
// such as "redis-server 7.0.15" or "valkey-server 8.0.1", for test logs
// and benchmark output.
func ServerUnderTest() string { return choice().name }

// Binary returns the path of the server binary ServerEnv picks, skipping t
// when it is missing outside CI and failing t when it is missing under
// CI=true (or when ServerEnv names no server at all).
func Binary(t testing.TB) string {
	t.Helper()
	c := choice()
	switch {
	case c.err == nil:
	case c.name == "": // ServerEnv names no server: a mistake, never a skip
		t.Fatal(c.err)
	case os.Getenv("CI") == "true":
		t.Fatalf("%v (CI=true requires it)", c.err)
	default:
		t.Skip(c.err)
	}
	return c.bin
}

// cliBinary returns the path of the command-line client that matches the
// server, failing or skipping t as Binary does when the server is missing.
func cliBinary(t testing.TB) string {
	t.Helper()
	Binary(t)
	c := choice()
	if c.cli == "" {
		t.Fatalf("no command-line client for %s on PATH (redis-cli or valkey-cli)", c.name)
	}
	return c.cli
}

// Available reports whether tests can start the server, so a test that
// also runs without it can leave its Redis part out. Under CI=true it is
// always true: Start then fails the test rather than skip it.
func Available() bool {
	return choice().err == nil || os.Getenv("CI") == "true"
}

// WithoutTime are the StartArgs of a server that refuses TIME, in scripts
// as everywhere, as AWS ElastiCache Serverless refuses it in scripts.
var WithoutTime = []string{"--rename-command", "TIME", ""}

// Persistent are the StartArgs of a server that writes every change to
// its append-only file and fsyncs it before answering (appendfsync
// always), so a Kill loses nothing and Restart brings back every key with
// its expiry, as a production server with AOF persistence does.
var Persistent = []string{"--appendonly", "yes", "--appendfsync", "always"}

// Start starts a standalone server without persistence.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// StartArgs starts a standalone server as Start does, with extra
// redis-server arguments after the common ones ("--requirepass", "secret").
func StartArgs(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, extra)
}

// start starts redis-server with extra arguments after the common ones.
func start(t testing.TB, extra []string) *Server {
	t.Helper()
	return startTLS(t, nil, extra)
}

// startTLS is start for a server that serves TLS only as o says, or
// plain TCP when o is nil.
func startTLS(t testing.TB, o *TLS, extra []string) *Server {
	t.Helper()
	var conf *tls.Config
	var tlsArgs func(port int) []string
	if o != nil {
		conf = o.clientConfig(t)
		tlsArgs = func(port int) []string { return o.tlsArgs(t, port) }
	}
	return startWithTLS(t, conf, func(s *Server) ([]string, error) {
		port := []string{"--port", strconv.Itoa(s.port)}
		if tlsArgs != nil {
			port = tlsArgs(s.port)
		}
		return append(append(port,
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--save", "",
			"--appendonly", "no",
			"--protected-mode", "yes",
			"--daemonize", "no",
			"--repl-diskless-sync-delay", "0",
		), extra...), nil
	})
}

// startWith starts redis-server with the arguments args gives for a fresh
// port and directory, retrying with another port if the free port it picked
// was taken before the server could bind it. Restart reuses args.
func startWith(t testing.TB, args func(s *Server) ([]string, error)) *Server {
	t.Helper()
	return startWithTLS(t, nil, args)
}

// startWithTLS is startWith for a server the harness reaches over TLS
// with conf, or plain TCP when conf is nil.
func startWithTLS(t testing.TB, conf *tls.Config, args func(s *Server) ([]string, error)) *Server {
	t.Helper()
	bin := Binary(t)
	var last error
	for range 3 {
		s := &Server{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), args: args, tls: conf}
		if last = s.launch(); last == nil {
			t.Cleanup(s.Stop)
			t.Logf("redistest: %s on %s", ServerUnderTest(), s.Addr())
			return s
		}
	}
	t.Fatalf("starting %s: %v", ServerUnderTest(), last)
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
		// An answer is this server's only if this process listens on
		// the port: another test process's server may hold it (see
		// proc.Listens), and ours is then about to exit.
		if err := ping(s.Addr(), s.tls); err == nil && proc.Listens(cmd.Process.Pid, s.port) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s on port %d exited: %s", ServerUnderTest(), s.port, tail(logPath))
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("%s on port %d did not answer PING within %v: %s", ServerUnderTest(), s.port, startTimeout, tail(logPath))
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
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, TLSConfig: s.tls})
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

// Kill ends the server with SIGKILL, as a crash or an OOM kill would: no
// shutdown, no final save. It waits for the process to exit; killing a
// stopped server does nothing. Restart starts it again.
func (s *Server) Kill() {
	cmd, done := proc.Take(&s.mu, &s.cmd, &s.done)
	if cmd == nil {
		return
	}
	proc.Stop(cmd.Process, done, 5*time.Second, syscall.SIGKILL)
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
		s.t.Fatalf("signal %v: %s on port %d is not running", sig, ServerUnderTest(), s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v to %s on port %d: %v", sig, ServerUnderTest(), s.port, err)
	}
}

// Restart stops the server (if it still runs) and starts it again on the
// same port and directory. The script cache is gone; so are the keys,
// unless the server was started with Persistent, whose append-only file
// brings them back.
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
	s.t.Fatalf("restarting %s on port %d: %v", ServerUnderTest(), s.port, err)
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

// ping sends PING over a fresh connection, TLS with conf unless it is
// nil, and checks that the server answers: PONG, or NOAUTH from one that
// requires a password.
func ping(addr string, conf *tls.Config) error {
	var conn net.Conn
	var err error
	dialer := &net.Dialer{Timeout: 200 * time.Millisecond}
	if conf != nil {
		conn, err = tls.DialWithDialer(dialer, "tcp", addr, conf)
	} else {
		conn, err = dialer.Dial("tcp", addr)
	}
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

// Cluster is a Redis Cluster: masters, and replicas when started by
// StartClusterWithReplicas.
type Cluster struct {
	Masters []*Server
	// Replicas are the replicas, Replicas[i] replicating Masters[i].
	Replicas []*Server
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
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, TLSConfig: c.Masters[0].tls})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// StartCluster starts masters servers with cluster mode on, joins them
// with redis-cli --cluster create and waits until every node reports
// cluster_state:ok.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, nil, masters, false, 5000)
}

// StartClusterTLS is StartCluster with nodes that serve TLS only, cluster
// bus and all, as o says.
func StartClusterTLS(t testing.TB, masters int, o TLS) *Cluster {
	t.Helper()
	return startCluster(t, &o, masters, false, 5000)
}

// ClusterNodeTimeout is the cluster-node-timeout of the nodes
// StartClusterWithReplicas starts: how long a master may be unreachable
// before its replica takes over, so a failover takes about this long plus
// an election.
const ClusterNodeTimeout = time.Second

// StartClusterWithReplicas starts a Cluster of masters masters with one
// replica each (redis-cli --cluster create --cluster-replicas 1) and
// ClusterNodeTimeout, and waits until every node reports cluster_state:ok
// and every replica is in sync with its master.
func StartClusterWithReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, nil, masters, true, ClusterNodeTimeout.Milliseconds())
}

// startCluster starts the nodes, joins them, and sorts them into masters
// and replicas by what CLUSTER NODES reports; o, unless nil, has them
// serve TLS only.
func startCluster(t testing.TB, o *TLS, masters int, replicas bool, nodeTimeoutMS int64) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli := cliBinary(t)
	nodes, perMaster, wantReplicas := masters, "0", 0
	if replicas {
		nodes, perMaster, wantReplicas = 2*masters, "1", masters
	}
	var all []*Server
	var addrs []string
	for range nodes {
		s := startTLS(t, o, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeoutMS, 10),
			"--cluster-port", strconv.Itoa(freePort(t)),
		})
		all = append(all, s)
		addrs = append(addrs, s.Addr())
	}
	var args []string
	if o != nil {
		args = o.cliArgs()
	}
	args = append(append(args, "--cluster", "create"), addrs...)
	args = append(args, "--cluster-replicas", perMaster, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", filepath.Base(cli), err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, s := range all {
		client := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.tls})
		for {
			err := clusterNodeReady(ctx, client, nodes, wantReplicas)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				client.Close()
				t.Fatalf("cluster node %s not ready within %v: %v", s.Addr(), startTimeout, err)
			}
			time.Sleep(pollInterval)
		}
		client.Close()
	}
	if !replicas {
		return &Cluster{Masters: all}
	}
	return sortCluster(t, ctx, all)
}

// clusterNodeReady reports why a node is not ready yet: cluster_state not
// ok, fewer known nodes than n or replicas than replicas, or, on a
// replica, its link to its master not up.
func clusterNodeReady(ctx context.Context, client *redis.Client, n, replicas int) error {
	info, err := client.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", n)) {
		return fmt.Errorf("CLUSTER INFO: %s", info)
	}
	nodes, err := client.ClusterNodes(ctx).Result()
	if err != nil {
		return err
	}
	if got := strings.Count(nodes, "slave "); got != replicas {
		return fmt.Errorf("CLUSTER NODES lists %d replicas, want %d: %s", got, replicas, nodes)
	}
	repl, err := client.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
		return fmt.Errorf("replica not in sync: %s", repl)
	}
	return nil
}

// sortCluster reads CLUSTER NODES from the first node and returns the
// masters with the replica of each.
func sortCluster(t testing.TB, ctx context.Context, all []*Server) *Cluster {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: all[0].Addr(), TLSConfig: all[0].tls})
	defer client.Close()
	nodes, err := client.ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v", err)
	}
	byPort := map[string]*Server{}
	for _, s := range all {
		byPort[strconv.Itoa(s.Port())] = s
	}
	// Each line: <id> <ip:port@cport> <flags> <master id or -> ...
	idOf := map[string]*Server{}
	masterOf := map[*Server]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		hostPort, _, _ := strings.Cut(f[1], "@")
		_, port, _ := net.SplitHostPort(hostPort)
		s := byPort[port]
		if s == nil {
			t.Fatalf("CLUSTER NODES names a node on port %s that was not started: %s", port, nodes)
		}
		idOf[f[0]] = s
		if strings.Contains(f[2], "slave") {
			masterOf[s] = f[3]
		}
	}
	c := &Cluster{}
	for _, s := range all {
		if _, isReplica := masterOf[s]; !isReplica {
			c.Masters = append(c.Masters, s)
		}
	}
	for _, m := range c.Masters {
		for r, id := range masterOf {
			if idOf[id] == m {
				c.Replicas = append(c.Replicas, r)
			}
		}
	}
	if len(c.Replicas) != len(c.Masters) || 2*len(c.Masters) != len(all) {
		t.Fatalf("cluster of %d nodes: %d masters, %d replicas matched to them, want one each: %s", len(all), len(c.Masters), len(c.Replicas), nodes)
	}
	return c
}

// Sentinel is a master and one replica watched by one or more Sentinels.
type Sentinel struct {
	Master, Replica *Server
	// Sentinel is the first Sentinel; Sentinels are all of them.
	Sentinel  *Server
	Sentinels []*Server
	// MasterName is the name the Sentinels monitor the master under.
	MasterName string
	// Password is what the Sentinels require of their clients
	// (requirepass), or empty. The master and replica require none.
	Password string
}

// Addr is the first Sentinel's address, the one a failover client is given.
func (s *Sentinel) Addr() string { return s.Sentinel.Addr() }

// Addrs are every Sentinel's address.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sen := range s.Sentinels {
		addrs[i] = sen.Addr()
	}
	return addrs
}

// StartSentinel starts a master, a replica of it, and a Sentinel (run as
// <server> <sentinel.conf> --sentinel, since Debian ships no separate
// redis-sentinel binary; valkey-server runs Sentinel the same way)
// monitoring the master as "floodgate-master", and waits until the replica
// is in sync and the Sentinel knows the master.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return StartSentinelAuth(t, "")
}

// StartSentinelAuth is StartSentinel with a Sentinel that requires
// password of its clients (none when it is empty).
func StartSentinelAuth(t testing.TB, password string) *Sentinel {
	t.Helper()
	return startSentinels(t, password, 1, 1)
}

// StartSentinelQuorum starts a master, a replica of it, and n Sentinels
// that need quorum of them to agree the master is down, and waits until
// the replica is in sync and every Sentinel knows the master, the replica
// and the n-1 other Sentinels, so a failover (SENTINEL FAILOVER, or the
// master's death) can run at once.
func StartSentinelQuorum(t testing.TB, n, quorum int) *Sentinel {
	t.Helper()
	if n < 1 || quorum < 1 || quorum > n {
		t.Fatalf("StartSentinelQuorum: %d Sentinels with quorum %d", n, quorum)
	}
	return startSentinels(t, "", n, quorum)
}

// startSentinels starts the master, its replica and n Sentinels.
func startSentinels(t testing.TB, password string, n, quorum int) *Sentinel {
	t.Helper()
	const name = "floodgate-master"
	master := Start(t)
	replica := start(t, []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())})
	s := &Sentinel{Master: master, Replica: replica, MasterName: name, Password: password}
	for range n {
		s.Sentinels = append(s.Sentinels, startWith(t, func(sen *Server) ([]string, error) {
			conf := filepath.Join(sen.dir, "sentinel.conf")
			body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d %d\nsentinel down-after-milliseconds %s 5000\n",
				sen.port, sen.dir, name, master.Port(), quorum, name)
			if password != "" {
				body += "requirepass " + password + "\n"
			}
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				return nil, fmt.Errorf("writing sentinel.conf: %w", err)
			}
			return []string{conf, "--sentinel"}, nil
		}))
	}
	s.Sentinel = s.Sentinels[0]

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	for {
		repl, err := mc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(repl, "connected_slaves:1") && strings.Contains(repl, "state=online") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("replica not in sync within %v: %v %q", startTimeout, err, repl)
		}
		time.Sleep(pollInterval)
	}
	for _, sen := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr(), Password: password})
		err := sentinelReady(ctx, sc, name, master.Port(), n)
		sc.Close()
		if err != nil {
			t.Fatalf("sentinel %s not ready within %v: %v", sen.Addr(), startTimeout, err)
		}
	}
	return s
}

// sentinelReady polls sc until it names the master on masterPort and
// knows its replica and the other Sentinels of a group of n, or ctx ends.
func sentinelReady(ctx context.Context, sc *redis.SentinelClient, name string, masterPort, n int) error {
	for {
		addr, err := sc.GetMasterAddrByName(ctx, name).Result()
		var why error
		switch {
		case err != nil:
			why = err
		case len(addr) != 2 || addr[1] != strconv.Itoa(masterPort):
			why = fmt.Errorf("names master %v, want port %d", addr, masterPort)
		default:
			why = sentinelPeers(ctx, sc, name, n)
		}
		if why == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return why
		case <-time.After(pollInterval):
		}
	}
}

// sentinelPeers checks that sc knows one replica and n-1 other Sentinels;
// a group of one needs no peers, and its replica is found by then.
func sentinelPeers(ctx context.Context, sc *redis.SentinelClient, name string, n int) error {
	if n == 1 {
		return nil
	}
	replicas, err := sc.Replicas(ctx, name).Result()
	if err != nil || len(replicas) != 1 {
		return fmt.Errorf("knows replicas %v (%v), want one", replicas, err)
	}
	peers, err := sc.Sentinels(ctx, name).Result()
	if err != nil || len(peers) != n-1 {
		return fmt.Errorf("knows %d other sentinels (%v), want %d", len(peers), err, n-1)
	}
	return nil
}

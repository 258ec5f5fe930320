// Package caddyproc runs real Caddy processes with Floodgate for end-to-end
// tests. Unit tests drive the handler through httptest; these drive it the
// way operators do, through a Caddyfile, a listener and the admin API, so
// directive ordering, error routes, placeholders and config reloads are
// tested as they behave in production.
//
// The Caddy binary is FLOODGATE_CADDY_BIN when set (scripts/test.sh builds
// it once for every package), otherwise `go build ./cmd/caddy` from the
// module root, once per test process.
//
// A Caddyfile given to Start or Load may contain placeholders the harness
// fills with free 127.0.0.1 addresses of its own:
//
//	{{admin}}                the admin endpoint, 127.0.0.1:<port>
//	{{http}}, {{http2}}, ... HTTP listeners, 127.0.0.1:<port>
//
// Each placeholder is replaced by one host:port on one line, so Caddyfile
// line numbers in error messages are those of the template. A typical test
// config:
//
//	{
//		admin {{admin}}
//		default_bind 127.0.0.1
//		auto_https off
//		persist_config off
//	}
//	http://{{http}} {
//		respond "ok"
//	}
package caddyproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/proc"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// BinaryEnv names the environment variable that points at a prebuilt Caddy
// with Floodgate, so CI builds it once for every test package.
const BinaryEnv = "FLOODGATE_CADDY_BIN"

// Timeouts of a process's life. They are generous because tests run on
// small, shared machines where a start under load can take seconds.
const (
	// startTimeout bounds how long Caddy may take to answer on its admin
	// endpoint and every HTTP listener.
	startTimeout = 30 * time.Second
	// stopTimeout is how long a SIGTERM may take before the process is
	// killed: Caddy waits for requests in flight, and a test may leave one.
	stopTimeout = 5 * time.Second
	// pollInterval is how often readiness is polled.
	pollInterval = 20 * time.Millisecond
	// loadTimeout bounds one POST /load, which returns only once the new
	// config runs.
	loadTimeout = 30 * time.Second
)

// placeholder matches the harness's own placeholders, and nothing Caddy
// itself gives meaning to ({{...}} of the templates directive is left as is).
var placeholder = regexp.MustCompile(`\{\{(admin|http[0-9]*)\}\}`)

// Instance is one running Caddy process.
type Instance struct {
	t       testing.TB
	dir     string
	adapter string
	env     []string // extra "NAME=value" for the process (WithEnv)
	// template is the config the instance was started with, which
	// Restart runs again.
	template string

	mu    sync.Mutex
	addrs map[string]string // placeholder name -> 127.0.0.1:port
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	log   *lockedBuffer
}

// Option changes how an instance's process is run.
type Option func(*Instance)

// WithEnv adds environment variables ("NAME=value") to the Caddy process
// only, so a config can read {env.NAME} (a JWT secret, say) without the
// test setting it process-wide, which t.Setenv forbids in parallel tests.
// Later entries win over earlier ones and over the test's own environment.
func WithEnv(vars ...string) Option {
	return func(i *Instance) { i.env = append(i.env, vars...) }
}

// Start runs Caddy with caddyfile (placeholders filled, see the package
// documentation) and returns once its admin endpoint and every referenced
// HTTP listener accept connections. The process is stopped by t.Cleanup.
func Start(t testing.TB, caddyfile string, opts ...Option) *Instance {
	t.Helper()
	return start(t, caddyfile, "caddyfile", opts)
}

// StartJSON is Start for a JSON config, such as the output of `caddy
// adapt`; the same placeholders are filled in it.
func StartJSON(t testing.TB, config string, opts ...Option) *Instance {
	t.Helper()
	return start(t, config, "json", opts)
}

// start launches Caddy, retrying with fresh ports when one it picked was
// taken by another process before Caddy could bind it.
func start(t testing.TB, config, adapter string, opts []Option) *Instance {
	t.Helper()
	if !strings.Contains(config, "{{admin}}") {
		t.Fatalf("caddyproc: the config must set its admin endpoint to {{admin}}, so parallel instances do not share localhost:2019")
	}
	if adapter == "caddyfile" && !strings.Contains(config, "bind 127.0.0.1") {
		t.Fatalf("caddyproc: the Caddyfile must bind to loopback only (default_bind 127.0.0.1 in its global options)")
	}
	bin := Binary(t)
	var last error
	for range 3 {
		inst := &Instance{t: t, dir: t.TempDir(), adapter: adapter, template: config, addrs: map[string]string{}, log: new(lockedBuffer)}
		for _, opt := range opts {
			opt(inst)
		}
		last = inst.launch(bin, config)
		if last == nil {
			t.Cleanup(inst.Stop)
			return inst
		}
		if !strings.Contains(last.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("caddyproc: starting caddy: %v", last)
	return nil
}

// launch writes the config, runs the process and waits for it to answer.
func (i *Instance) launch(bin, template string) error {
	config, listeners, err := i.expand(template)
	if err != nil {
		return err
	}
	name := "Caddyfile"
	if i.adapter == "json" {
		name = "caddy.json"
	}
	path := filepath.Join(i.dir, name)
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return err
	}
	home := filepath.Join(i.dir, "home")
	args := []string{"run", "--config", path}
	if i.adapter != "json" {
		args = append(args, "--adapter", i.adapter)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = i.dir
	// Caddy keeps certificates, autosaved configs and locks under these;
	// a temporary home keeps parallel instances and the user's own apart.
	cmd.Env = append(os.Environ(),
		"HOME="+home,
		"XDG_DATA_HOME="+filepath.Join(home, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"),
	)
	// exec uses the last value of a repeated name, so these override.
	cmd.Env = append(cmd.Env, i.env...)
	cmd.Stdout, cmd.Stderr = i.log, i.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	i.mu.Lock()
	i.cmd, i.done = cmd, done
	i.mu.Unlock()

	if err := i.waitReady(listeners, cmd.Process.Pid, done); err != nil {
		i.Stop()
		return fmt.Errorf("%w\n--- caddy output ---\n%s", err, i.Log())
	}
	return nil
}

// waitReady polls until the admin endpoint answers and each listener
// accepts a connection, each on a socket of process pid (an answer from
// another test process's Caddy that got the port first is not this one's:
// see proc.Listens). Listeners are only dialled, never sent a request, so
// no rate limit is touched before the test begins.
func (i *Instance) waitReady(listeners []string, pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	defer client.CloseIdleConnections()
	pending := append([]string{"admin"}, listeners...)
	for len(pending) > 0 {
		if i.answers(client, pending[0]) && i.listens(pid, pending[0]) {
			pending = pending[1:]
			continue
		}
		select {
		case <-exited:
			return errors.New("caddy exited before it was ready")
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caddy did not answer on %s (%s) within %v", pending[0], i.Addr(pending[0]), startTimeout)
		}
	}
	return nil
}

// answers reports whether the named address is ready: the admin endpoint
// serves its config, an HTTP listener accepts a connection.
func (i *Instance) answers(client *http.Client, name string) bool {
	if name == "admin" {
		resp, err := client.Get(i.Admin() + "/config/")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	conn, err := net.DialTimeout("tcp", i.Addr(name), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// listens reports whether process pid listens on the named address's
// port.
func (i *Instance) listens(pid int, name string) bool {
	_, port, err := net.SplitHostPort(i.Addr(name))
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && proc.Listens(pid, n)
}

// expand fills the placeholders of template, allocating a free port for
// each name seen for the first time, and returns the config with the HTTP
// listener names it references, in order of first use.
func (i *Instance) expand(template string) (string, []string, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var listeners []string
	seen := map[string]bool{}
	var failed error
	config := placeholder.ReplaceAllStringFunc(template, func(m string) string {
		name := m[2 : len(m)-2]
		addr, ok := i.addrs[name]
		if !ok {
			var err error
			if addr, err = i.newAddr(); err != nil {
				failed = err
				return m
			}
			i.addrs[name] = addr
		}
		if name != "admin" && !seen[name] {
			seen[name] = true
			listeners = append(listeners, name)
		}
		return addr
	})
	return config, listeners, failed
}

// Addr is the host:port a placeholder name ("admin", "http", "http2", ...)
// was given; the test fails if the config never used that name.
func (i *Instance) Addr(name string) string {
	i.mu.Lock()
	addr, ok := i.addrs[name]
	i.mu.Unlock()
	if !ok {
		i.t.Fatalf("caddyproc: the config has no {{%s}}", name)
	}
	return addr
}

// URL is the URL of path on the {{http}} listener.
func (i *Instance) URL(path string) string { return i.URLOn("http", path) }

// URLOn is the URL of path on the named listener ("http2", ...).
func (i *Instance) URLOn(listener, path string) string {
	return "http://" + i.Addr(listener) + path
}

// Admin is the base URL of the admin API.
func (i *Instance) Admin() string { return "http://" + i.Addr("admin") }

// Load replaces the running config with caddyfile through the admin API
// (POST /load), filling placeholders as Start does: names already used keep
// their ports, new ones get free ports. It returns once the new config runs,
// or the admin API's error text when the config is refused.
func (i *Instance) Load(caddyfile string) error {
	config, _, err := i.expand(caddyfile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, i.Admin()+"/load", strings.NewReader(config))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("POST /load: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		// The admin API answers {"error": "..."}; its text is what an
		// operator reads, so that is what tests match against.
		var apiErr struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &apiErr) == nil && apiErr.Error != "" {
			return fmt.Errorf("POST /load: %s: %s", resp.Status, apiErr.Error)
		}
		return fmt.Errorf("POST /load: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// Log is everything the process has written to stdout and stderr so far:
// Caddy's logs, for failure messages.
func (i *Instance) Log() string { return i.log.String() }

// Stop ends the process with SIGTERM, so Caddy runs its Cleanup hooks, and
// kills it if it has not exited within stopTimeout. Stopping a stopped
// instance does nothing.
func (i *Instance) Stop() {
	cmd, done := proc.Take(&i.mu, &i.cmd, &i.done)
	if cmd == nil {
		return
	}
	proc.Stop(cmd.Process, done, stopTimeout, syscall.SIGTERM)
}

// Restart stops the process and runs Caddy again as Start did: with the
// config it was started with (not one loaded since), in the same
// directory and home, so what Caddy saved in its storage (under
// XDG_DATA_HOME) is found again, and on the same ports, or fresh ones if
// another process took one meanwhile. It returns once the new process
// answers, as Start does; the test fails if it cannot start.
func (i *Instance) Restart() {
	i.t.Helper()
	i.Stop()
	bin := Binary(i.t)
	var last error
	for range 3 {
		if last = i.launch(bin, i.template); last == nil {
			return
		}
		if !strings.Contains(last.Error(), "address already in use") {
			break
		}
		i.mu.Lock()
		i.addrs = map[string]string{}
		i.mu.Unlock()
	}
	i.t.Fatalf("caddyproc: restarting caddy: %v", last)
}

// handedOut are the addresses newAddr gave any instance of this process,
// never handed out again. Caddy binds its listeners with SO_REUSEPORT, so
// two Caddy processes of one user that are given one port both bind it,
// with no error to retry on, and the kernel spreads the connections over
// both: a test then reads another test's Caddy (seen in CI: a reload test
// answered by a parallel test's "uno"). A port found free and released can
// be handed out again at once, to this instance or another.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// newAddr picks a free loopback address that no instance of this process
// was given before (see handedOut), so no two placeholders share one,
// which for one instance would be a config error, not the bind error
// start retries on. Another process (a redis-server) may still take the
// port before Caddy binds it; start retries when that happens, since a
// process that binds without SO_REUSEPORT makes Caddy's bind fail.
func (i *Instance) newAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		port, err := testutil.FreePort("127.0.0.1")
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if !handedOut.addrs[addr] && !slices.Contains(slices.Collect(maps.Values(i.addrs)), addr) {
			handedOut.addrs[addr] = true
			return addr, nil
		}
	}
	return "", errors.New("finding a free port: the same ports keep coming back")
}

// lockedBuffer collects the process's output, written by exec's copying
// goroutines and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

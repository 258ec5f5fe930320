package e2e

// The harness: Caddy configs, an HTTP client that survives reloads, the
// admin API, upstreams that hold requests, and what the docs promise
// that tests wait on; the rate-limit fields of an answer, read as
// structured fields; and the Redis half: Caddyfiles whose zones keep their
// state in Redis, and what tests read from a server as an operator would
// with redis-cli (keys, INFO, CLIENT LIST). Every other file of the
// package builds on it; a helper one test file alone uses stays there.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// Figures the docs give, which tests wait on or bound by.
const (
	// leaseLifetime is how long a local_quota lease is spent at most
	// ("A lease is spent for at most a second").
	leaseLifetime = time.Second
	// denyCacheDefault is deny_cache's default ("default 1s").
	denyCacheDefault = time.Second
	// releaseGrace is how long after a reload a replaced config's Redis
	// client is kept at least ("no sooner than 1s after the reload").
	releaseGrace = time.Second
)

// globalsWith opens a test Caddyfile: the harness's admin port, loopback
// only, no certificates, nothing autosaved; servers is the text of any
// `servers` global options.
func globalsWith(servers string) string {
	return `{
	admin {{admin}}
	default_bind 127.0.0.1
	auto_https off
	persist_config off
` + servers + `}
`
}

// globals opens most test Caddyfiles: globalsWith a server that trusts
// 127.0.0.1 as a proxy, so tests can present other client IPs with
// X-Forwarded-For.
var globals = globalsWith(`	servers {
		trusted_proxies static 127.0.0.1/32
	}
`)

// site returns globals and one site on {{http}} with a rate_limit block
// made of the given lines and a respond "ok" after it.
func site(rateLimit string) string {
	return globals + `
http://{{http}} {
	rate_limit {
` + rateLimit + `
	}
	respond "ok"
}
`
}

// readFile is the content of the file at path (from e2e/), or fails t.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startExample runs one of the docs' example Caddyfiles (under
// examples/) as written, but on the harness's ports: its admin endpoint
// (localhost:2019) and site (:8080, beyond loopback) may be taken, and its
// upstream (localhost:9000), if it has one, is the test's: upstream, which
// is "" for an example without one. more are further replacements, each
// of text the example must hold, such as its Redis server's address or a
// second upstream (localhost:9001).
func startExample(t *testing.T, name, upstream string, more ...[2]string) *caddyproc.Instance {
	t.Helper()
	cfg := string(readFile(t, "../examples/"+name))
	subs := [][2]string{
		{"admin localhost:2019", "admin {{admin}}\n\tdefault_bind 127.0.0.1"},
		{"\n:8080 {", "\nhttp://{{http}} {"},
	}
	if upstream != "" {
		subs = append(subs, [2]string{"localhost:9000", upstream})
	}
	subs = append(subs, more...)
	for _, sub := range subs {
		if !strings.Contains(cfg, sub[0]) {
			t.Fatalf("examples/%s no longer has %q", name, sub[0])
		}
		cfg = strings.ReplaceAll(cfg, sub[0], sub[1])
	}
	return caddyproc.Start(t, cfg)
}

// response is what a test keeps of one exchange.
type response struct {
	code   int
	header http.Header
	body   string
	// start is when the request was sent; done is when the response body
	// had been read.
	start, done time.Time
}

// took is how long the exchange lasted.
func (r response) took() time.Duration { return r.done.Sub(r.start) }

// hasRateLimitHeaders reports whether any rate-limit field was set: a zone
// that failed open, or a request no zone evaluated, sets none.
func (r response) hasRateLimitHeaders() bool {
	for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
		if r.header.Get(h) != "" {
			return true
		}
	}
	return false
}

// newClient returns a client that never uses a proxy from the environment
// and opens a connection per request: a reload through the admin API closes
// Caddy's idle connections, and a request sent on one just as it closes
// would fail. A fresh connection can still be dropped by a reload (see
// send), which send retries.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// send makes one request; headers are name, value pairs. It may run on any
// goroutine, so it returns errors rather than failing the test.
//
// A GET or HEAD whose connection ends before any response (EOF, a reset,
// or a broken pipe while the request is written) is sent once more: each config binds its own socket (SO_REUSEPORT), so a
// connection the kernel queued on the old config's socket is reset when a
// reload closes it, and a kept-alive connection can be closed by the old
// server as the request goes out. Neither reached a handler. A server that
// fails for real fails the second attempt too, and an error after the
// response began is never retried.
func send(c *http.Client, method, url string, headers ...string) (response, error) {
	r, err := sendOnce(c, method, url, headers...)
	if err != nil && (method == http.MethodGet || method == http.MethodHead) && droppedBeforeResponse(err) {
		var again error
		if r, again = sendOnce(c, method, url, headers...); again != nil {
			return response{}, fmt.Errorf("%w (retried after %v)", again, err)
		}
		return r, nil
	}
	return r, err
}

// errBeforeResponse marks an error of sendOnce that came before any
// response: only those may be retried.
type errBeforeResponse struct{ err error }

func (e errBeforeResponse) Error() string { return e.err.Error() }
func (e errBeforeResponse) Unwrap() error { return e.err }

// droppedBeforeResponse reports whether err is a connection that ended,
// cleanly or by a reset, before any response came.
func droppedBeforeResponse(err error) bool {
	var before errBeforeResponse
	return errors.As(err, &before) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

func sendOnce(c *http.Client, method, url string, headers ...string) (response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return response{}, errBeforeResponse{err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(body), start: start, done: time.Now()}, nil
}

// get is send for the test goroutine: a GET that must get an answer.
func get(t *testing.T, c *http.Client, url string, headers ...string) response {
	t.Helper()
	r, err := send(c, http.MethodGet, url, headers...)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return r
}

// sequence sends n GETs one after another and returns their responses.
// untilReloaded sends GETs of url until one is served the way the
// config just loaded serves it (served says so, or why not): Caddy's
// /load returns once the old servers have begun to shut down, and a
// connection the old server accepts in that moment (its own comment says
// the scheduler may delay its Shutdown) is still served by the old config.
// Each GET is one the test would otherwise assert on, so only requests
// that change nothing in a store may be sent this way.
func untilReloaded(t *testing.T, c *http.Client, url string, served func(response) error, headers ...string) {
	t.Helper()
	testutil.Eventually(t, "a reload serves "+url, func() error {
		r, err := send(c, http.MethodGet, url, headers...)
		if err != nil {
			return err
		}
		return served(r)
	})
}

func sequence(t *testing.T, c *http.Client, n int, url string, headers ...string) []response {
	t.Helper()
	out := make([]response, n)
	for i := range out {
		out[i] = get(t, c, url, headers...)
	}
	return out
}

func codes(rs []response) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.code
	}
	return out
}

func wantCodes(t *testing.T, what string, rs []response, want ...int) {
	t.Helper()
	if got := codes(rs); !slices.Equal(got, want) {
		for i, r := range rs {
			t.Logf("%s: response %d: %d %v", what, i+1, r.code, r.header)
		}
		t.Fatalf("%s: statuses %v, want %v", what, got, want)
	}
}

// expectCodes sends len(want) GETs one after another and marks the test
// failed, going on, unless their statuses are want, in order; it returns
// the responses.
func expectCodes(t *testing.T, what string, c *http.Client, url string, want []int, headers ...string) []response {
	t.Helper()
	rs := sequence(t, c, len(want), url, headers...)
	if got := codes(rs); !slices.Equal(got, want) {
		t.Errorf("%s: statuses %v, want %v", what, got, want)
	}
	return rs
}

// awayFromBoundary waits, if need be, until at least margin remains of the
// current aligned window of length w, so a test of a fixed or sliding
// counter does not straddle a window boundary. It returns the end of the
// window the test will run in.
func awayFromBoundary(t *testing.T, w, margin time.Duration) time.Time {
	t.Helper()
	now := time.Now()
	end := now.Truncate(w).Add(w)
	if end.Sub(now) < margin {
		t.Logf("waiting %v for the next %v window", end.Sub(now), w)
		time.Sleep(end.Sub(now) + 10*time.Millisecond)
		end = end.Add(w)
	}
	return end
}

// lineOf is the 1-based line of the first line of s containing sub.
func lineOf(t *testing.T, s, sub string) int {
	t.Helper()
	for i, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return i + 1
		}
	}
	t.Fatalf("%q not in config", sub)
	return 0
}

// jsonPath walks nested objects of a decoded JSON config.
func jsonPath(t *testing.T, v map[string]any, keys ...string) map[string]any {
	t.Helper()
	for _, k := range keys {
		next, ok := v[k].(map[string]any)
		if !ok {
			t.Fatalf("config has no object at %q", k)
		}
		v = next
	}
	return v
}

// clientHeader is the X-Client header many zones of these tests key on;
// none for "".
func clientHeader(client string) []string {
	if client == "" {
		return nil
	}
	return []string{"X-Client", client}
}

// keyHash names a key as the admin API's top, the decision samples and
// the Redis key names do: the first 16 bytes of its SHA-256 in hex, as
// docs/reference.md documents.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// burstResult counts the answers to one burst of requests.
type burstResult struct {
	ok, denied int
	// other lists every status that was neither 200 nor 429, and errs
	// every request that got no answer.
	other       []int
	errs        []error
	okPerServer []int
	elapsed     time.Duration
}

// wantAnswered fails t unless every request of the burst was answered
// 200 or 429.
func (res burstResult) wantAnswered(t *testing.T, what string) {
	t.Helper()
	if len(res.errs) > 0 || len(res.other) > 0 {
		t.Errorf("%s: %d requests unanswered (first: %v), other statuses %v: want only 200 and 429",
			what, len(res.errs), firstErr(res.errs), res.other)
	}
}

// burst sends n requests at once (each goroutine waits for one start
// signal), the i-th to urls[i%len(urls)], and counts the answers.
func burst(c *http.Client, urls []string, n int) burstResult {
	res := burstResult{okPerServer: make([]int, len(urls))}
	codes := make([]int, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := send(c, http.MethodGet, urls[i%len(urls)])
			codes[i], errs[i] = r.code, err
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	res.elapsed = time.Since(began)
	for i, code := range codes {
		switch {
		case errs[i] != nil:
			res.errs = append(res.errs, errs[i])
		case code == http.StatusOK:
			res.ok++
			res.okPerServer[i%len(urls)]++
		case code == http.StatusTooManyRequests:
			res.denied++
		default:
			res.other = append(res.other, code)
		}
	}
	return res
}

// firstErr is the first of errs, or nil, for failure messages.
func firstErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// upstream is a backend on 127.0.0.1 for reverse_proxy: it counts the
// requests in flight and records the most it ever saw at once, what a
// concurrency zone must bound. While its gate is closed (hold) every
// request waits until open; otherwise each waits delay.
type upstream struct {
	url      string // host:port
	delay    time.Duration
	arrived  chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	total    atomic.Int64

	mu   sync.Mutex
	gate chan struct{} // nil while open
}

// newUpstream starts an open upstream that holds each request for delay.
func newUpstream(t *testing.T, delay time.Duration) *upstream {
	t.Helper()
	u := &upstream{delay: delay, arrived: make(chan struct{}, 1024)}
	u.url = newLoopbackServer(t, http.HandlerFunc(u.serve))
	// Registered after the server's shutdown, so it runs first: held
	// requests finish and the shutdown need not wait for them.
	t.Cleanup(u.open)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.inFlight.Add(1)
	u.total.Add(1)
	for {
		p := u.peak.Load()
		if n <= p || u.peak.CompareAndSwap(p, n) {
			break
		}
	}
	u.mu.Lock()
	gate := u.gate
	u.mu.Unlock()
	select {
	case u.arrived <- struct{}{}:
	default:
	}
	wait := time.After(u.delay)
	if gate != nil {
		wait = nil
	}
	select {
	case <-gate:
	case <-wait:
	case <-r.Context().Done():
	}
	// Leave before the response is written: once the proxy sees the
	// response, this request no longer counts as in flight here.
	u.inFlight.Add(-1)
	fmt.Fprint(w, "upstream")
}

// hold closes the gate: requests from now on wait until open. It forgets
// the arrivals before it, so waitArrivals counts the requests held.
func (u *upstream) hold() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gate == nil {
		u.gate = make(chan struct{})
	}
	for {
		select {
		case <-u.arrived:
		default:
			return
		}
	}
}

// open lets every held request through, and later ones pass after delay.
func (u *upstream) open() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gate != nil {
		close(u.gate)
		u.gate = nil
	}
}

// waitArrivals waits until n more requests have reached the upstream, for
// at most 30 seconds.
func (u *upstream) waitArrivals(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case <-u.arrived:
		case <-timeout:
			t.Fatalf("upstream: fewer than %d requests arrived", n)
		}
	}
}

// newLoopbackServer serves h on a free 127.0.0.1 port until the test
// ends and returns its host:port.
func newLoopbackServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening on loopback: %v", err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return l.Addr().String()
}

// rateLimitSeries reads the instance's /metrics: each Floodgate series,
// name and labels as exposed, with its value.
func rateLimitSeries(t *testing.T, c *http.Client, inst *caddyproc.Instance) map[string]string {
	t.Helper()
	m := get(t, c, inst.Admin()+"/metrics")
	out := map[string]string{}
	for line := range strings.SplitSeq(m.body, "\n") {
		if strings.HasPrefix(line, "caddy_http_rate_limit_") {
			name, value, _ := strings.Cut(line, " ")
			out[name] = value
		}
	}
	return out
}

// wantSeries fails the test unless each rate-limit series named in want
// has its value in the instance's /metrics.
func wantSeries(t *testing.T, c *http.Client, inst *caddyproc.Instance, want map[string]string) {
	t.Helper()
	series := rateLimitSeries(t, c, inst)
	for name, v := range want {
		if series[name] != v {
			t.Errorf("%s = %q, want %s", name, series[name], v)
		}
	}
}

// adminCall sends method to the instance's admin API at path and decodes
// the JSON answer into out (when not nil); it returns the status.
func adminCall(t *testing.T, inst *caddyproc.Instance, method, path string, out any) int {
	t.Helper()
	return adminSend(t, inst, method, path, "", out)
}

// keyReport is a key's state as inspect answers it (docs/admin-api.md
// shows its fields).
type keyReport struct {
	Zone       string  `json:"zone"`
	Tier       string  `json:"tier"`
	Key        string  `json:"key"`
	Limit      int64   `json:"limit"`
	Remaining  int64   `json:"remaining"`
	ResetAfter float64 `json:"reset_after"`
	// Override is the key's runtime override in force, if any.
	Override map[string]any `json:"override"`
}

// keyReset is the answer of reset.
type keyReset struct {
	Zone  string `json:"zone"`
	Tier  string `json:"tier"`
	Key   string `json:"key"`
	Reset bool   `json:"reset"`
}

// zoneTop is the answer of top: a zone's hottest keys.
type zoneTop struct {
	Zone string   `json:"zone"`
	Keys []hotKey `json:"keys"`
}

// hotKey is one key of top's answer.
type hotKey struct {
	Key      string `json:"key"`
	Requests uint64 `json:"requests"`
	Denied   uint64 `json:"denied"`
}

// goroutineProfile is Caddy's goroutine profile from pprof on the admin
// endpoint, at the given debug level (1: one record per distinct stack,
// with counts; 2: every goroutine's stack), with the count its first line
// gives at level 1, or the number of goroutines at level 2.
func goroutineProfile(t *testing.T, inst *caddyproc.Instance, debug int) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := inst.Admin() + "/debug/pprof/goroutine?debug=" + strconv.Itoa(debug)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	profile := b.String()
	if debug >= 2 {
		// Each goroutine's stack opens with a line "goroutine <id> [...]".
		return strings.Count("\n"+profile, "\ngoroutine "), profile
	}
	first, _, _ := strings.Cut(profile, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		t.Fatalf("goroutine profile starts %q, status %s", first, resp.Status)
	}
	return n, profile
}

// ownGoroutines is the stacks, in Caddy's goroutine profile, of the
// goroutines that run code of Floodgate or of go-redis or were started by
// it: those a config's zones may leave behind.
func ownGoroutines(t *testing.T, inst *caddyproc.Instance) []string {
	t.Helper()
	_, profile := goroutineProfile(t, inst, 2)
	var own []string
	for g := range strings.SplitSeq(profile, "\n\n") {
		if strings.Contains(g, "github.com/redis/go-redis/") || strings.Contains(g, "github.com/floodgatehq/caddy-ratelimit") {
			own = append(own, strings.TrimSpace(g))
		}
	}
	return own
}

// redisTimeout is the decision timeout of tests that need every decision
// to come from Redis: far above a round trip even on a loaded machine.
const redisTimeout = "2s"

// redisRoute is one path of a test site: a rate_limit with a single zone,
// named after the path, answered by `respond` or by a reverse proxy.
type redisRoute struct {
	// path is matched exactly; the zone is named path without its slash.
	path string
	// zone holds the zone's options, one per line.
	zone string
	// upstream, when set, is a reverse_proxy target instead of respond.
	upstream string
}

// redisSite is a Caddyfile with one site whose routes each have their own
// rate_limit with the given redis block. The redis blocks are identical, so
// the routes share one pooled client, as an operator's would.
func redisSite(redisBlock string, routes ...redisRoute) string {
	var b strings.Builder
	b.WriteString(globalsWith(""))
	b.WriteString("\nhttp://{{http}} {\n")
	for _, r := range routes {
		fmt.Fprintf(&b, "\thandle %s {\n\t\trate_limit {\n\t\t\tzone %s {\n", r.path, strings.TrimPrefix(r.path, "/"))
		for line := range strings.SplitSeq(strings.TrimSpace(r.zone), "\n") {
			fmt.Fprintf(&b, "\t\t\t\t%s\n", strings.TrimSpace(line))
		}
		b.WriteString("\t\t\t\tstore redis\n\t\t\t}\n")
		for line := range strings.SplitSeq(strings.TrimSpace(redisBlock), "\n") {
			fmt.Fprintf(&b, "\t\t\t%s\n", strings.TrimSpace(line))
		}
		b.WriteString("\t\t}\n")
		if r.upstream != "" {
			fmt.Fprintf(&b, "\t\treverse_proxy %s\n", r.upstream)
		} else {
			b.WriteString("\t\trespond \"ok\"\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// redisURLBlock is a redis block for a standalone server.
func redisURLBlock(addr, timeout string) string {
	return fmt.Sprintf("redis {\nurl redis://%s\ntimeout %s\n}", addr, timeout)
}

// startRedisSite starts a standalone redis-server and a Caddy serving
// redisSite on it with the given decision timeout: the setup of every test
// that needs one server and whose zones need nothing else of the config.
func startRedisSite(t *testing.T, timeout string, routes ...redisRoute) (*redistest.Server, *caddyproc.Instance) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, caddyproc.Start(t, redisSite(redisURLBlock(srv.Addr(), timeout), routes...))
}

// redisReply is the reply to one command (named by what in the failure)
// run on s within 10s; an error fails the test, so what the tests read
// from a server is one line each.
func redisReply[T any](t *testing.T, s *redistest.Server, what string, cmd func(ctx context.Context) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cmd(ctx)
	if err != nil {
		t.Fatalf("%s on %s: %v", what, s.Addr(), err)
	}
	return v
}

// redisDBSize is the number of keys on one server.
func redisDBSize(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	return redisReply(t, s, "DBSIZE", func(ctx context.Context) (int64, error) {
		return s.Client(t).DBSize(ctx).Result()
	})
}

// configRedisSite is a one-zone site for config tests; body tells configs
// apart, and the client is named so CLIENT LIST shows Caddy's connections.
func configRedisSite(redisAddr, body string) string {
	return oneRedisZoneSite("cfg", "sliding_window_log\nevents 3\nwindow 1h\nfail closed", redisAddr, redisTimeout, body)
}

// oneRedisZoneSite is a site with one redis zone named zone, keyed by the
// X-Client header, with the given algorithm line's value and further
// options (one per line), a named client (so CLIENT LIST shows Caddy's
// connections) and the decision timeout; body tells configs apart.
func oneRedisZoneSite(zone, algorithm, redisAddr, timeout, body string) string {
	var opts strings.Builder
	for line := range strings.SplitSeq("algorithm "+algorithm, "\n") {
		fmt.Fprintf(&opts, "\t\t\t%s\n", line)
	}
	return globalsWith("") + fmt.Sprintf(`
http://{{http}} {
	rate_limit {
		zone %s {
			key header X-Client
%s			store redis
		}
		redis {
			url redis://%s/0?client_name=floodgate-caddy
			timeout %s
		}
	}
	respond %q
}
`, zone, opts.String(), redisAddr, timeout, body)
}

// clientsNamed is CLIENT LIST on s: the connections whose client name
// (set with client_name in a redis block's url) match names, each as its
// fields, such as "id" and "name".
func clientsNamed(t *testing.T, s *redistest.Server, match func(name string) bool) []map[string]string {
	t.Helper()
	list := redisReply(t, s, "CLIENT LIST", func(ctx context.Context) (string, error) {
		return s.Client(t).ClientList(ctx).Result()
	})
	var out []map[string]string
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		fields := map[string]string{}
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			fields[k] = v
		}
		if match(fields["name"]) {
			out = append(out, fields)
		}
	}
	return out
}

// caddyConnIDs lists the ids of the connections named floodgate-caddy on
// a server: Caddy's, per oneRedisZoneSite.
func caddyConnIDs(t *testing.T, s *redistest.Server) []string {
	t.Helper()
	var ids []string
	for _, c := range clientsNamed(t, s, func(name string) bool { return name == "floodgate-caddy" }) {
		ids = append(ids, c["id"])
	}
	slices.Sort(ids)
	return ids
}

// infoInt is an integer field of an INFO section on s, such as
// used_memory_dataset of "memory".
func infoInt(t *testing.T, s *redistest.Server, section, field string) int64 {
	t.Helper()
	info := redisReply(t, s, "INFO "+section, func(ctx context.Context) (string, error) {
		return s.Client(t).Info(ctx, section).Result()
	})
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s %q: %v", section, field, v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s: %s", section, field, info)
	return 0
}

// evalCalls is how many scripts a server has run for clients (EVALSHA
// and EVAL in INFO commandstats). A replica runs none: Redis 7 replicates
// a script's effects, not the script.
func evalCalls(ctx context.Context, c *redis.Client) (int64, error) {
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for line := range strings.SplitSeq(stats, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:calls=") && !strings.HasPrefix(line, "cmdstat_eval:calls=") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		calls, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n, nil
}

// decided says why r was not decided by its zone in Redis: it carries no
// rate-limit field, as a zone that failed open answers.
func decided(r response) error {
	if r.hasRateLimitHeaders() {
		return nil
	}
	return fmt.Errorf("status %d without rate-limit fields: the zone failed open", r.code)
}

// decidedClosed says why r, of a `fail closed` zone, was not decided in
// Redis: it is the 503 that zone answers while Redis fails.
func decidedClosed(r response) error {
	if r.code == http.StatusServiceUnavailable {
		return errors.New("503: the zone fails closed")
	}
	return nil
}

// intHeader reads a header that must hold an integer.
func intHeader(t *testing.T, r response, name string) int64 {
	t.Helper()
	v := r.header.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not an integer (status %d, headers %v)", name, v, r.code, r.header)
	}
	return n
}

// member is one zone's entry of RateLimit or RateLimit-Policy.
type member struct {
	zone   string
	params map[string]any
}

// fieldMembers parses a RateLimit or RateLimit-Policy field as an RFC 9651
// List of Strings with parameters, failing the test if it does not parse.
func fieldMembers(t *testing.T, r response, name string) []member {
	t.Helper()
	v := r.header.Values(name)
	if len(v) != 1 {
		t.Fatalf("%s: want one field line, got %q", name, v)
	}
	items, err := parseSFList(v[0])
	if err != nil {
		t.Fatalf("%s: %q does not parse as an RFC 9651 List: %v", name, v[0], err)
	}
	out := make([]member, len(items))
	for i, it := range items {
		s, ok := it.value.(string)
		if !ok {
			t.Fatalf("%s: member %d of %q is %T, want a String", name, i, v[0], it.value)
		}
		out[i] = member{zone: s, params: map[string]any{}}
		for _, p := range it.params {
			out[i].params[p.key] = p.value
		}
	}
	return out
}

// zoneParams is the parameters of zone's member of field, which must exist.
func zoneParams(t *testing.T, r response, field, zone string) map[string]any {
	t.Helper()
	for _, m := range fieldMembers(t, r, field) {
		if m.zone == zone {
			return m.params
		}
	}
	t.Fatalf("%s: no member for zone %q in %q", field, zone, r.header.Get(field))
	return nil
}

// intParam reads an Integer parameter.
func intParam(t *testing.T, params map[string]any, key string) int64 {
	t.Helper()
	n, ok := params[key].(int64)
	if !ok {
		t.Fatalf("parameter %s is %#v, want an Integer (params %v)", key, params[key], params)
	}
	return n
}

// wantRemaining checks what the headers say is left: X-RateLimit-Remaining
// and the zone's r in RateLimit.
func wantRemaining(t *testing.T, what string, rs []response, zone string, want ...int64) {
	t.Helper()
	for i, r := range rs {
		if got := intHeader(t, r, "X-RateLimit-Remaining"); got != want[i] {
			t.Errorf("%s: request %d: X-RateLimit-Remaining %d, want %d", what, i+1, got, want[i])
		}
		if got := intParam(t, zoneParams(t, r, "RateLimit", zone), "r"); got != want[i] {
			t.Errorf("%s: request %d: RateLimit r=%d, want %d", what, i+1, got, want[i])
		}
	}
}

// checkDenial checks the fields every 429 carries: Retry-After in whole
// seconds within [lo, hi], and the refusing zone's t equal to it.
func checkDenial(t *testing.T, r response, zone string, lo, hi int64) int64 {
	t.Helper()
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", r.code)
	}
	retry := intHeader(t, r, "Retry-After")
	if retry < 1 || retry < lo || retry > hi {
		t.Errorf("Retry-After %d, want within [%d, %d] and at least 1", retry, max(lo, 1), hi)
	}
	if tp := intParam(t, zoneParams(t, r, "RateLimit", zone), "t"); tp != retry {
		t.Errorf("RateLimit t=%d on a denial, want Retry-After %d", tp, retry)
	}
	if rem := intHeader(t, r, "X-RateLimit-Remaining"); rem != 0 {
		t.Errorf("X-RateLimit-Remaining %d on a denial, want 0", rem)
	}
	return retry
}

// policyQuota is q of zone's member of RateLimit-Policy, which must exist.
func policyQuota(t *testing.T, r response, zone string) int64 {
	t.Helper()
	return intParam(t, zoneParams(t, r, "RateLimit-Policy", zone), "q")
}

// checkPolicy checks RateLimit-Policy, and X-RateLimit-Limit against its q.
func checkPolicy(t *testing.T, rs []response, zone, want string) {
	t.Helper()
	for i, r := range rs {
		if got := r.header.Get("RateLimit-Policy"); got != want {
			t.Errorf("response %d: RateLimit-Policy %q, want %q", i+1, got, want)
		}
		if got, q := intHeader(t, r, "X-RateLimit-Limit"), policyQuota(t, r, zone); got != q {
			t.Errorf("response %d: X-RateLimit-Limit %d, want the policy's q=%d", i+1, got, q)
		}
	}
}

// wantRetryAbout checks that r's Retry-After points at about when (within
// 2 s either way: the response's own time is known to the second).
func wantRetryAbout(t *testing.T, r response, when time.Time, what string) {
	t.Helper()
	want := int64(math.Ceil(when.Sub(r.done).Seconds()))
	if got := intHeader(t, r, "Retry-After"); got < want-2 || got > want+2 {
		t.Errorf("Retry-After %d, want about %d (%s)", got, want, what)
	}
}

// wantResetWithin checks that X-RateLimit-Reset, an epoch second rounded
// up, lies between lo and hi after the response.
func wantResetWithin(t *testing.T, r response, lo, hi time.Duration) {
	t.Helper()
	reset := intHeader(t, r, "X-RateLimit-Reset")
	at := r.done.Unix()
	if reset < at+int64(lo.Seconds()) || reset > at+int64(hi.Seconds())+1 {
		t.Errorf("X-RateLimit-Reset %d is %ds after the response, want %v to %v", reset, reset-at, lo, hi)
	}
}

// sfParam is one parameter of a structured-field Item.
type sfParam struct {
	key   string
	value any
}

// sfItem is a structured-field Item: a bare value (string for String and
// Token, int64 for Integer, float64 for Decimal, bool for Boolean) with its
// parameters.
type sfItem struct {
	value  any
	params []sfParam
}

// parseSFList parses an RFC 9651 List whose members are Items (inner
// lists and byte sequences are not used by the rate-limit fields and are
// refused). It is strict, so a field it accepts parses anywhere.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	var out []sfItem
	err := p.members(func() error {
		it, err := p.item()
		out = append(out, it)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// sfMember is one member of a structured-field Dictionary.
type sfMember struct {
	key  string
	item sfItem
}

// parseSFDictionary parses an RFC 9651 Dictionary whose members are Items
// (draft 7's RateLimit: limit=100, remaining=50, reset=30), in order. A
// key given twice is refused: RFC 9651 keeps the last, but a field that
// repeats one says two things and a client may read either.
func parseSFDictionary(s string) ([]sfMember, error) {
	p := &sfParser{s: s}
	var out []sfMember
	err := p.members(func() error {
		key, err := p.key()
		if err != nil {
			return err
		}
		var it sfItem
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			it, err = p.item()
		} else {
			it, err = p.params(true) // a bare key is the Boolean true
		}
		if err != nil {
			return err
		}
		for _, m := range out {
			if m.key == key {
				return fmt.Errorf("key %s repeated", key)
			}
		}
		out = append(out, sfMember{key, it})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

type sfParser struct {
	s string
	i int
}

// members reads the comma-separated members of a List or a Dictionary,
// the whole string, calling member to read each: the separators and the
// white space around them are the same in both (RFC 9651 4.2.1, 4.2.2),
// and neither may end in a comma.
func (p *sfParser) members(member func() error) error {
	p.skip(" ")
	for p.i < len(p.s) {
		if err := member(); err != nil {
			return err
		}
		p.skip(" \t")
		if p.i == len(p.s) {
			return nil
		}
		if p.s[p.i] != ',' {
			return fmt.Errorf("at %d: want ',' between members, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skip(" \t")
		if p.i == len(p.s) {
			return errors.New("trailing comma")
		}
	}
	return nil
}

func (p *sfParser) skip(chars string) {
	for p.i < len(p.s) && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	return p.params(v)
}

// params reads the parameters of an Item whose bare value v was read.
func (p *sfParser) params(v any) (sfItem, error) {
	it := sfItem{value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var pv any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if pv, err = p.bareItem(); err != nil {
				return sfItem{}, err
			}
		}
		for _, q := range it.params {
			if q.key == key {
				return sfItem{}, fmt.Errorf("parameter %s repeated", key)
			}
		}
		it.params = append(it.params, sfParam{key, pv})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: a key starts with a lowercase letter or '*'", p.i)
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || strings.IndexByte("_-.*", c) >= 0) {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.i >= len(p.s) {
		return nil, errors.New("unexpected end, want a value")
	}
	switch c := p.s[p.i]; {
	case c == '"':
		return p.str()
	case c == '-' || isDigit(c):
		return p.number()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("at %d: malformed Boolean", p.i)
	case c == '*' || isAlpha(c):
		start := p.i
		p.i++
		for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return p.s[start:p.i], nil
	default:
		return nil, fmt.Errorf("at %d: unsupported or malformed value starting %q", p.i, c)
	}
}

func (p *sfParser) str() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", fmt.Errorf("at %d: a backslash in a String must escape '\"' or '\\'", p.i)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("at %d: byte %#x not allowed in a String", p.i-1, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("unterminated String")
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits, dot := 0, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			if digits > 12 {
				return nil, errors.New("Decimal with more than 12 integer digits")
			}
			dot = p.i
		} else if !isDigit(c) {
			break
		}
		if c != '.' {
			digits++
		}
		p.i++
	}
	text := p.s[start:p.i]
	if digits == 0 {
		return nil, fmt.Errorf("at %d: malformed number", start)
	}
	if dot < 0 {
		if digits > 15 {
			return nil, errors.New("Integer with more than 15 digits")
		}
		return strconv.ParseInt(text, 10, 64)
	}
	if frac := p.i - dot - 1; frac < 1 || frac > 3 {
		return nil, errors.New("Decimal needs 1 to 3 fractional digits")
	}
	return strconv.ParseFloat(text, 64)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }

func isAlpha(c byte) bool { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }

// isTChar is RFC 9110's tchar.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// overrideView is one override as the admin API shows it.
type overrideView struct {
	Key       string  `json:"key"`
	Action    string  `json:"action"`
	Limit     int64   `json:"limit"`
	Window    string  `json:"window"`
	Burst     int64   `json:"burst"`
	Expires   string  `json:"expires"`
	ExpiresIn float64 `json:"expires_in"`
}

// adminSend is adminCall with a request body: it sends method to the
// instance's admin API at path with body (none for "") and decodes the
// JSON answer into out (when not nil); it returns the status.
func adminSend(t *testing.T, inst *caddyproc.Instance, method, path, body string, out any) int {
	t.Helper()
	var payload io.Reader
	if body != "" {
		payload = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, inst.Admin()+path, payload)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, answer, err)
		}
	}
	return resp.StatusCode
}

// overridesPath is the admin API path of zone's overrides, and of key's
// when key is not "".
func overridesPath(zone, key string) string {
	p := "/rate_limit/zones/" + url.PathEscape(zone) + "/overrides"
	if key != "" {
		p += "?key=" + url.QueryEscape(key)
	}
	return p
}

// zoneStatus is one zone of the answer, as docs/client-status.md shows
// it.
type zoneStatus struct {
	Zone      string `json:"zone"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Reset     int64  `json:"reset"`
	Window    int64  `json:"window"`
}

// askStatus GETs a status URL as the client with headers and decodes the
// answer by zone, checking what every answer must be: 200, JSON, no
// caching, none of secrets in the body.
func askStatus(t *testing.T, c *http.Client, url string, secrets []string, headers ...string) (map[string]zoneStatus, string) {
	t.Helper()
	r := get(t, c, url, headers...)
	if r.code != http.StatusOK {
		t.Fatalf("GET %s: %d %q", url, r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("GET %s: Cache-Control %q, want no-store", url, cc)
	}
	for _, s := range secrets {
		if strings.Contains(r.body, s) {
			t.Errorf("GET %s: the answer %q shows the key %q", url, r.body, s)
		}
	}
	var answer struct {
		Zones []zoneStatus `json:"zones"`
	}
	if err := json.Unmarshal([]byte(r.body), &answer); err != nil || answer.Zones == nil {
		t.Fatalf("GET %s: answer %q is not {\"zones\": [...]}: %v", url, r.body, err)
	}
	byZone := map[string]zoneStatus{}
	for _, z := range answer.Zones {
		if _, dup := byZone[z.Zone]; dup {
			t.Errorf("GET %s: zone %s answered twice in %q", url, z.Zone, r.body)
		}
		byZone[z.Zone] = z
	}
	return byZone, r.body
}

// wantStatus checks a zone's limit, remaining and window, and that its
// reset lies within its window (after its last request, a second or two
// ago at most).
func wantStatus(t *testing.T, what string, got map[string]zoneStatus, zone string, limit, remaining, window int64) {
	t.Helper()
	z, ok := got[zone]
	switch {
	case !ok:
		t.Errorf("%s: zone %s is not answered: %+v", what, zone, got)
	case z.Limit != limit || z.Remaining != remaining || z.Window != window:
		t.Errorf("%s: %+v, want limit %d, remaining %d, window %d", what, z, limit, remaining, window)
	case remaining == limit && z.Reset != 0, z.Reset < 0 || z.Reset > window:
		t.Errorf("%s: %+v: reset outside [0, window], or not 0 while full", what, z)
	}
}

// startShardServers starts n standalone servers for a redis block's
// shards.
func startShardServers(t *testing.T, n int) []*redistest.Server {
	t.Helper()
	servers := make([]*redistest.Server, n)
	for i := range servers {
		servers[i] = redistest.Start(t)
	}
	return servers
}

// startObserver starts a Caddy that serves no request but declares the
// zones of cfg without local_quota, so that its admin API inspects what
// Redis counts: an instance's own answer adds what its lease still holds.
// A zone's limit, not its leases, names its state in Redis, so the two
// configs share it.
func startObserver(t *testing.T, cfg string) *caddyproc.Instance {
	t.Helper()
	return caddyproc.Start(t, localQuotaLine.ReplaceAllString(cfg, ""))
}

// localQuotaLine matches a zone's local_quota option and its line break.
var localQuotaLine = regexp.MustCompile(`(?m)^\s*local_quota .*\n`)

// operationsSite has a memory zone, a redis zone, a tiered zone, a zone
// with log_key, one zone name in two handlers and a zone whose name holds
// a '/', each on its own path.
func operationsSite(redisAddr string) string {
	limit := func(path, zone, opts string) string {
		return fmt.Sprintf(`	handle %s {
		rate_limit {
			zone %s {
				key {header.X-Client}
				algorithm fixed_window
				rate 3/1h
%s			}
			redis {
				url redis://%s
				timeout 2s
			}
		}
		respond "ok"
	}
`, path, zone, opts, redisAddr)
	}
	return globalsWith("") + "\nhttp://{{http}} {\n" +
		limit("/mem", "mem", "") +
		limit("/red", "red", "\t\t\t\tstore redis\n") +
		limit("/tiered", "tiered", "\t\t\t\ttier {header.X-Plan} {\n\t\t\t\t\tgold 5/1h\n\t\t\t\t}\n") +
		limit("/shared1", "shared", "") +
		limit("/shared2", "shared", "") +
		strings.Replace(limit("/logged", "logged", ""), "\t\t\tredis {", "\t\t\tlog_key\n\t\t\tredis {", 1) +
		limit("/slashed", "api/v1", "") +
		"}\n"
}

// startOperations runs redis-server and a Caddy serving operationsSite on
// it, whose log the test shows if it fails.
func startOperations(t *testing.T) (*caddyproc.Instance, *http.Client) {
	t.Helper()
	srv := redistest.Start(t)
	inst := caddyproc.Start(t, operationsSite(srv.Addr()))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	return inst, newClient(t)
}

package e2e

// The harness: Caddy configs, an HTTP client that survives reloads, the
// admin API, upstreams that hold requests, and what the README promises
// that tests wait on. Every other file of the package builds on it.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
)

// Figures the README documents, which tests wait on or bound by.
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

// startExample runs one of the README's example Caddyfiles (under
// examples/) as written, but on the harness's ports: its admin endpoint
// (localhost:2019) and site (:8080, beyond loopback) may be taken, and its
// upstream (localhost:9000), if it has one, is the test's: upstream, which
// is "" for an example without one.
func startExample(t *testing.T, name, upstream string) *caddyproc.Instance {
	t.Helper()
	raw, err := os.ReadFile("../examples/" + name)
	if err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	cfg := string(raw)
	subs := [][2]string{
		{"admin localhost:2019", "admin {{admin}}\n\tdefault_bind 127.0.0.1"},
		{"\n:8080 {", "\nhttp://{{http}} {"},
	}
	if upstream != "" {
		subs = append(subs, [2]string{"localhost:9000", upstream})
	}
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
// A GET or HEAD whose connection ends before any response (EOF or reset)
// is sent once more: each config binds its own socket (SO_REUSEPORT), so a
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
	return errors.As(err, &before) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
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
// the README documents.
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

// adminCall sends method to the instance's admin API at path and decodes
// the JSON answer into out (when not nil); it returns the status.
func adminCall(t *testing.T, inst *caddyproc.Instance, method, path string, out any) int {
	t.Helper()
	return adminSend(t, inst, method, path, "", out)
}

// keyState is a key's state as inspect answers it (the README's Admin
// API section shows its fields).
type keyState struct {
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

package ratelimit

// The root package's test harness: the helpers the package's tests share,
// to provision a handler from a Caddyfile, send it requests, read its
// answers, drive the admin API and set overrides, and hold requests in
// flight. A helper used by one test file only stays in that file.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Configs: built, parsed and adapted.

// parseDirective parses a rate_limit directive as the Caddyfile adapter
// does, without provisioning it.
func parseDirective(t testing.TB, input string) (*Handler, error) {
	t.Helper()
	d := caddyfile.NewTestDispenser(input)
	h := new(Handler)
	return h, h.UnmarshalCaddyfile(d)
}

// parseErrorCase is a rate_limit directive the parser must refuse, and
// what its error must say (zone name, option, ":<line>").
type parseErrorCase struct {
	name, input string
	want        []string
}

func runParseErrorCases(t *testing.T, cases []parseErrorCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseDirective(t, tc.input)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// adaptRedisBlock adapts a site whose one zone keeps its state in Redis,
// with body as its redis block's lines, and parses the same directive:
// the adapted JSON and the handler.
func adaptRedisBlock(t *testing.T, body string) ([]byte, *Handler) {
	t.Helper()
	directive := "rate_limit {\n\tzone shared {\n\t\trate 10/s\n\t\tstore redis\n\t}\n\tredis {\n\t\t" +
		strings.ReplaceAll(body, "\n", "\n\t\t") + "\n\t}\n}\n"
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, warnings, err := adapter.Adapt([]byte(":8080 {\n"+directive+"respond \"ok\"\n}\n"), nil)
	if err != nil {
		t.Fatalf("adapt: %v (warnings %v)", err, warnings)
	}
	h, err := parseDirective(t, directive)
	if err != nil {
		t.Fatal(err)
	}
	return out, h
}

// wantAdapted fails t for each string of want the adapted JSON out lacks.
func wantAdapted(t *testing.T, out []byte, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("adapted JSON lacks %s:\n%s", w, out)
		}
	}
}

// rateLimitConfig is a rate_limit directive of the given blocks, one after
// another: zones (zoneConfig), a redis block (redisConfig), or any other
// block or line of the directive.
func rateLimitConfig(blocks ...string) string { return configBlock("rate_limit", blocks...) }

// zoneConfig is the block of zone name with the given options, one a
// line; a nested block (tier, count_response) is given line by line, its
// "{" and "}" included.
func zoneConfig(name string, opts ...string) string { return configBlock("zone "+name, opts...) }

// redisConfig is a redis block whose server is addr, with any further
// options.
func redisConfig(addr string, opts ...string) string {
	return configBlock("redis", append([]string{"url redis://" + addr}, opts...)...)
}

// configBlock is a Caddyfile block: head, then lines, one a line, in
// braces.
func configBlock(head string, lines ...string) string {
	return head + " {\n" + strings.Join(lines, "\n") + "\n}"
}

// adaptedRoute is one route of the HTTP servers of a Caddyfile adapted to
// JSON: its matchers and its handlers, each as written.
type adaptedRoute struct {
	Match  []map[string]any  `json:"match"`
	Handle []json.RawMessage `json:"handle"`
}

// adaptedRoutes is every route of the HTTP servers of out, the JSON
// config caddyfile.Adapter wrote.
func adaptedRoutes(t *testing.T, out []byte) []adaptedRoute {
	t.Helper()
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []adaptedRoute `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var routes []adaptedRoute
	for _, srv := range cfg.Apps.HTTP.Servers {
		routes = append(routes, srv.Routes...)
	}
	return routes
}

// Handlers: provisioned, and sent requests.

// serveInParallel sends n requests of ip through h to next at once, each
// on a goroutine of wg.
func serveInParallel(wg *sync.WaitGroup, h *Handler, ip string, n int, next caddyhttp.Handler) {
	for range n {
		wg.Go(func() {
			r, _ := newKeyRequest(ip, nil)
			serve(h, r, next)
		})
	}
}

// provisionHandler parses a rate_limit directive and provisions it as Caddy
// would, releasing it when the test ends.
func provisionHandler(t testing.TB, input string) *Handler {
	t.Helper()
	return provisionHandlerAt(t, input, nil)
}

// provisionHandlerAt is provisionHandler with the handler's (and its
// stores') clock set; nil is the system clock.
func provisionHandlerAt(t testing.TB, input string, clock limiter.Clock) *Handler {
	t.Helper()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
		t.Fatal(err)
	}
	h.clock = clock
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := h.Provision(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.Cleanup()
		cancel()
	})
	return h
}

var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// noteReached is a next handler that answers as okHandler and sets
// *reached: whether the request got past the handler under test.
func noteReached(reached *bool) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		*reached = true
		return okHandler(w, r)
	})
}

// wantClientLeft checks that a request whose client left ended with 499
// (code) without reaching the next handler (reached, by noteReached).
func wantClientLeft(t *testing.T, code int, reached bool) {
	t.Helper()
	if code != statusClientClosedRequest {
		t.Errorf("status %d, want %d (the client left)", code, statusClientClosedRequest)
	}
	if reached {
		t.Error("the request went on to the next handler after its client left")
	}
}

// serve runs one request through h and returns the recorder and the
// status: the handler's error status for refusals, else the written one.
func serve(h *Handler, r *http.Request, next caddyhttp.Handler) (*httptest.ResponseRecorder, int) {
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, r, next)
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return w, he.StatusCode
	}
	if err != nil {
		return w, -1
	}
	return w, w.Code
}

// aborts is a next handler that breaks off its response before writing
// any, as reverse_proxy does when the upstream or the client breaks off:
// it panics with http.ErrAbortHandler, which net/http turns into a closed
// connection.
var aborts = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
	panic(http.ErrAbortHandler)
})

// serveAborted sends one request of ip through h to next, which panics
// (aborts, or one that writes part of a response first), and recovers the
// panic as net/http's server would.
func serveAborted(h *Handler, ip string, next caddyhttp.Handler) {
	defer func() { _ = recover() }()
	r, _ := newKeyRequest(ip, nil)
	serve(h, r, next)
}

// serveAll sends len(want) requests from ip through h, calling after (if
// not nil) after each, and fails unless they are answered with want.
func serveAll(t *testing.T, h *Handler, ip string, want []int, after func()) {
	t.Helper()
	var codes []int
	for range want {
		r, _ := newKeyRequest(ip, nil)
		_, code := serve(h, r, okHandler)
		codes = append(codes, code)
		if after != nil {
			after()
		}
	}
	if !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
}

// newKeyRequest builds a request as Caddy's server would hand it to a
// handler: a replacer and the vars holding the client IP.
func newKeyRequest(clientIP string, headers map[string]string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/api/items?page=2", nil)
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	repl := caddyhttp.NewTestReplacer(r)
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: clientIP})
	r = r.WithContext(ctx)
	return r, repl
}

// serveIP sends one request of client ip through h and returns its status.
func serveIP(h *Handler, ip string) int {
	_, code := serveFrom(h, ip, okHandler)
	return code
}

// serveFrom sends one request of client ip through h to next, as serve.
func serveFrom(h *Handler, ip string, next caddyhttp.Handler) (*httptest.ResponseRecorder, int) {
	r, _ := newKeyRequest(ip, nil)
	return serve(h, r, next)
}

// serveKey sends one request from ip with header X-Plan: plan (if not
// "") and returns its status and rate-limit fields.
func serveKey(h *Handler, ip, plan string) (int, http.Header) {
	return servePlan(h, ip, plan, nil)
}

// servePlan sends one request from ip with the given header fields (a
// key's, say) and X-Plan: plan (if not ""), and returns its status and
// response header.
func servePlan(h *Handler, ip, plan string, headers map[string]string) (int, http.Header) {
	hdr := maps.Clone(headers)
	if hdr == nil {
		hdr = map[string]string{}
	}
	if plan != "" {
		hdr["X-Plan"] = plan
	}
	r, _ := newKeyRequest(ip, hdr)
	w, code := serve(h, r, okHandler)
	return code, w.Header()
}

// answer is a next handler that writes status, with the given header
// fields, and a body.
func answer(status int, fields ...string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		for i := 0; i+1 < len(fields); i += 2 {
			w.Header().Set(fields[i], fields[i+1])
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("body"))
		return nil
	})
}

// remaining is the zone's remaining count in r's RateLimit field.
func remainingIn(t *testing.T, hdr http.Header, zone string) string {
	t.Helper()
	for _, item := range strings.Split(hdr.Get("RateLimit"), ",") {
		item = strings.TrimSpace(item)
		if rest, ok := strings.CutPrefix(item, `"`+zone+`";r=`); ok {
			r, _, _ := strings.Cut(rest, ";")
			return r
		}
	}
	t.Fatalf("no %s in RateLimit %q", zone, hdr.Get("RateLimit"))
	return ""
}

// counterValue reads a Prometheus counter of a zone's metrics.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// eachStore runs f as a subtest named after each store a zone can keep
// its state in, memory and redis.
func eachStore(t *testing.T, f func(t *testing.T, store string)) {
	for _, store := range []string{storeMemory, storeRedis} {
		t.Run(store, func(t *testing.T) { f(t, store) })
	}
}

// Caddy run in this process, whole: config in, HTTP out.

// loopbackPorts are two free ports on 127.0.0.1: one for Caddy's admin
// endpoint and one for its HTTP server.
func loopbackPorts(t *testing.T) (adminPort, httpPort int) {
	t.Helper()
	var err error
	if adminPort, err = testutil.FreePort("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if httpPort, err = testutil.FreePort("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	return adminPort, httpPort
}

// loadCaddy runs cfg, a JSON config, as this process's Caddy until the
// test ends, and returns a client for its servers that goes through no
// proxy.
func loadCaddy(t *testing.T, cfg []byte) *http.Client {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading Caddy: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Minute}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// getWith sends GET url through c with the header field name: value, and
// returns the response's status, header and body.
func getWith(t *testing.T, c *http.Client, url, name, value string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(name, value)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// Overrides and the admin API.

// setOverride sets key's override in h's zone name, as the admin API does
// (the zone's set, then the give-back of leases).
func setOverride(t testing.TB, h *Handler, name, key string, o limiter.Override) {
	t.Helper()
	setOverrideAt(t, h, name, key, o, time.Now())
}

// setOverrideAt is setOverride with the give-back of leases decided at now.
func setOverrideAt(t testing.TB, h *Handler, name, key string, o limiter.Override, now time.Time) {
	t.Helper()
	z := handlerZone(t, h, name)
	if err := z.checkOverride(o); err != nil {
		t.Fatal(err)
	}
	if _, err := z.ov.set.put(context.Background(), key, o, keepGen([]*zone{z}, o, now)); err != nil {
		t.Fatal(err)
	}
	z.overrideChanged(key, nil)
	// The set outlives the handler (a memory zone's overrides are the
	// process's): leave none behind for the next test of this name.
	t.Cleanup(func() { z.ov.set.table().Remove(key) })
}

func handlerZone(t testing.TB, h *Handler, name string) *zone {
	t.Helper()
	for _, z := range h.zones {
		if z.name == name {
			return z
		}
	}
	t.Fatalf("no zone %q", name)
	return nil
}

// adminOverride sends one request to the admin API's overrides route of
// zone name and returns its status and body (an adminError's status when
// the route refused it).
func adminOverride(t *testing.T, method, name, key, body string) (int, string) {
	t.Helper()
	target := adminPrefix + "zones/" + url.PathEscape(name) + "/overrides"
	if key != "" {
		target += "?key=" + url.QueryEscape(key)
	}
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	w := httptest.NewRecorder()
	if err := serveAdmin(w, r); err != nil {
		var ae caddy.APIError
		if errors.As(err, &ae) {
			return ae.HTTPStatus, ae.Message
		}
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return w.Code, w.Body.String()
}

// cliAgainstAdmin is an admin client, as the CLI's subcommands use, of
// the real admin routes served in this process until the test ends.
func cliAgainstAdmin(t *testing.T) *adminClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := serveAdmin(w, r); err != nil {
			var ae caddy.APIError
			errors.As(err, &ae)
			w.WriteHeader(ae.HTTPStatus)
			_ = json.NewEncoder(w).Encode(ae)
		}
	}))
	t.Cleanup(srv.Close)
	return &adminClient{addr: strings.TrimPrefix(srv.URL, "http://")}
}

// Requests held in flight.

// heldRequest is one request a test keeps in flight: its next handler
// waits on release, so a concurrency slot stays taken until then.
type heldRequest struct {
	admitted chan int
	release  chan struct{}
	done     chan struct{}
}

// holdKey sends a request of ip through h on a goroutine, with headers; its
// admitted channel says 200 once next runs, or the refusal's status.
func holdKey(h *Handler, ip string, headers map[string]string) heldRequest {
	hd := heldRequest{admitted: make(chan int, 1), release: make(chan struct{}), done: make(chan struct{})}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		hd.admitted <- 200
		<-hd.release
		w.WriteHeader(200)
		return nil
	})
	go func() {
		defer close(hd.done)
		r, _ := newKeyRequest(ip, headers)
		if _, code := serve(h, r, next); code != 200 {
			hd.admitted <- code
		}
	}()
	return hd
}

// finish lets every held request end and waits for it.
func finish(hs ...heldRequest) {
	for _, hd := range hs {
		close(hd.release)
	}
	for _, hd := range hs {
		<-hd.done
	}
}

// Benchmarks: the memory held, and requests each with a fresh replacer.

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// benchPrepared is how many requests are prepared per stop of the timer.
const benchPrepared = 1024

// benchRequests fills reqs with copies of bases in turn, each with its
// own replacer (Caddy's HTTP providers, then whatever the handler maps), from
// the same client IP as BenchmarkHandlerIPKey's. Requests are shallow
// copies of one per token, so preparing them allocates little and the
// garbage collector, which runs while the timer does, is not charged for
// much more than the handler's own allocations.
func benchRequests(reqs []*http.Request, bases []*http.Request) {
	for i := range reqs {
		r := new(http.Request)
		*r = *bases[i%len(bases)]
		caddyhttp.NewTestReplacer(r)
		reqs[i] = r
	}
}

// benchServe runs one request through h to next, clearing the headers
// the previous one left, as BenchmarkHandlerIPKey does.
func benchServe(b *testing.B, h *Handler, w *httptest.ResponseRecorder, r *http.Request, next caddyhttp.Handler) {
	clear(w.Header())
	if err := h.ServeHTTP(w, r, next); err != nil {
		b.Fatal(err)
	}
}

// benchServeFresh times h serving copies of bases in turn, each with a
// fresh replacer as Caddy gives every request, prepared benchPrepared at
// a time with the timer stopped.
func benchServeFresh(b *testing.B, h *Handler, bases []*http.Request) {
	benchServeFreshTo(b, h, bases, okHandler)
}

// benchServeFreshTo is benchServeFresh with next as the handler behind h.
func benchServeFreshTo(b *testing.B, h *Handler, bases []*http.Request, next caddyhttp.Handler) {
	reqs := make([]*http.Request, benchPrepared)
	benchRequests(reqs, bases)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%benchPrepared == 0 && i > 0 {
			b.StopTimer()
			benchRequests(reqs, bases)
			b.StartTimer()
		}
		benchServe(b, h, w, reqs[i%benchPrepared], next)
	}
}

// serveHeld serves a request of ip through h in the background, and
// returns once it is inside the next handler, which answers 200 (with
// X-Tokens: tokens, unless tokens is empty) when release is closed; done
// gets the status. It is a request in flight across whatever the test
// does meanwhile: a reload, a refusal, a reset.
func serveHeld(h *Handler, ip, tokens string) (release chan struct{}, done chan int) {
	started := make(chan struct{})
	release, done = make(chan struct{}), make(chan int)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(started)
		<-release
		if tokens != "" {
			w.Header().Set("X-Tokens", tokens)
		}
		w.WriteHeader(200)
		return nil
	})
	go func() {
		r, _ := newKeyRequest(ip, nil)
		_, code := serve(h, r, next)
		done <- code
	}()
	<-started
	return release, done
}

package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

func TestHandlerMultipleZonesRefund(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_wide {
			key ip
			algorithm fixed_window
			rate 100/1h
		}
		zone b_narrow {
			key ip
			algorithm fixed_window
			rate 2/1h
		}
	}`)
	serveAll(t, h, "198.51.100.1", []int{200, 200, 429, 429}, nil)
	// The wide zone gave back what the refused requests took: two spent.
	r, _ := newKeyRequest("198.51.100.1", nil)
	w, _ := serve(h, r, okHandler)
	if got := w.Header().Get("RateLimit"); !strings.Contains(got, `"a_wide";r=98;`) {
		t.Fatalf("RateLimit %q: refused requests consumed from a_wide", got)
	}
}

func TestHandlerHeaders(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone "we\"ird\zone" {
			algorithm token_bucket
			rate 100/1m
			burst 20
		}
	}`)
	r, _ := newKeyRequest("198.51.100.2", nil)
	w, code := serve(h, r, okHandler)
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	hdr := w.Header()
	if got, want := hdr.Get("RateLimit-Policy"), `"we\"ird\\zone";q=20;w=12`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := hdr.Get("RateLimit"), `"we\"ird\\zone";r=19;t=1`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if hdr.Get("X-RateLimit-Limit") != "20" || hdr.Get("X-RateLimit-Remaining") != "19" {
		t.Errorf("X-RateLimit: %v", hdr)
	}
	reset, err := strconv.ParseInt(hdr.Get("X-RateLimit-Reset"), 10, 64)
	if now := time.Now().Unix(); err != nil || reset < now || reset > now+2 {
		t.Errorf("X-RateLimit-Reset %q not within a second or two of now", hdr.Get("X-RateLimit-Reset"))
	}
	for range 19 {
		r, _ := newKeyRequest("198.51.100.2", nil)
		serve(h, r, okHandler)
	}
	r, repl := newKeyRequest("198.51.100.2", nil)
	w, code = serve(h, r, okHandler)
	if code != 429 {
		t.Fatalf("21st request: status %d", code)
	}
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1 (0.6s rounded up)", got)
	}
	if got := w.Header().Get("RateLimit"); got != `"we\"ird\\zone";r=0;t=1` {
		t.Errorf("RateLimit on 429: %q", got)
	}
	if v, _ := repl.GetString("http.rate_limit.exceeded.name"); v != `we"ird\zone` {
		t.Errorf("exceeded.name placeholder %q", v)
	}
	if v, _ := repl.GetString("http.rate_limit.retry_after"); v != "1" {
		t.Errorf("retry_after placeholder %q", v)
	}
}

func TestHandlerMissingKey(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		codes []int
	}{
		{"deny", []int{429, 429}},
		{"skip", []int{200, 200, 200}},
		{"ip", []int{200, 429}},
	} {
		// Zones of one name and policy share state across handlers, so
		// each case has its own zone.
		h := provisionHandler(t, "rate_limit {\n zone missing_"+tc.mode+" {\n  key header X-API-Key\n  rate 1/1h\n  missing_key "+tc.mode+"\n }\n}")
		var codes []int
		for range tc.codes {
			r, _ := newKeyRequest("198.51.100.4", nil)
			_, code := serve(h, r, okHandler)
			codes = append(codes, code)
		}
		if !slices.Equal(codes, tc.codes) {
			t.Errorf("missing_key %s: codes %v, want %v", tc.mode, codes, tc.codes)
		}
		// A real key is limited on its own, whatever the missing ones did.
		r, _ := newKeyRequest("198.51.100.4", map[string]string{"X-API-Key": "k"})
		if _, code := serve(h, r, okHandler); code != 200 {
			t.Errorf("missing_key %s: keyed request got %d", tc.mode, code)
		}
	}
}

func TestHandlerDryRun(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone dry {\n  rate 1/1h\n  dry_run\n }\n}")
	for i := range 3 {
		w, code := serveFrom(h, "198.51.100.5", okHandler)
		if code != 200 {
			t.Fatalf("dry run refused request %d", i)
		}
		if i > 0 && w.Header().Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("dry run request %d: remaining %q", i, w.Header().Get("X-RateLimit-Remaining"))
		}
	}
}

func TestHandlerConcurrencyReleases(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone conc {\n  algorithm concurrency\n  events 2\n }\n}")
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		started <- struct{}{}
		<-release
		return nil
	})
	var wg sync.WaitGroup
	serveInParallel(&wg, h, "198.51.100.6", 2, slow)
	<-started
	<-started
	w, code := serveFrom(h, "198.51.100.6", okHandler)
	if code != 429 {
		t.Fatalf("third concurrent request: %d", code)
	}
	if got := w.Header().Get("RateLimit-Policy"); !strings.Contains(got, `qu="concurrent-requests"`) {
		t.Errorf("RateLimit-Policy %q lacks qu", got)
	}
	close(release)
	wg.Wait()
	for range 3 {
		if _, code := serveFrom(h, "198.51.100.6", okHandler); code != 200 {
			t.Fatalf("after release: %d", code)
		}
	}
}

func TestHandlerLeakyBucketHolds(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone leaky_hold {\n  algorithm leaky_bucket\n  rate 10/s\n  max_delay 200ms\n }\n}")
	// Four requests at once: three are admitted, held 0, 100 and 200ms so
	// they continue 1/r apart; the fourth would wait 300ms and is refused.
	start := time.Now()
	type result struct {
		code int
		at   time.Duration
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			_, code := serveFrom(h, "198.51.100.7", okHandler)
			results <- result{code, time.Since(start)}
		}()
	}
	var admitted []time.Duration
	refused := 0
	for range 4 {
		res := <-results
		switch res.code {
		case 200:
			admitted = append(admitted, res.at)
		case 429:
			refused++
		default:
			t.Fatalf("status %d", res.code)
		}
	}
	if len(admitted) != 3 || refused != 1 {
		t.Fatalf("admitted %d, refused %d; want 3 and 1", len(admitted), refused)
	}
	slices.Sort(admitted)
	if admitted[1] < 90*time.Millisecond || admitted[2] < 190*time.Millisecond {
		t.Fatalf("admitted at %v; want holds of about 0, 100ms and 200ms", admitted)
	}
}

func TestHandlerLeakyHoldCancelled(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone leaky_cancel {\n  algorithm leaky_bucket\n  rate 1/1m\n  max_delay 1h\n }\n}")
	serveFrom(h, "198.51.100.8", okHandler)
	r, _ := newKeyRequest("198.51.100.8", nil)
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, code := serve(h, r.WithContext(ctx), okHandler)
	if code != statusClientClosedRequest || time.Since(start) > time.Second {
		t.Fatalf("cancelled hold: status %d after %v", code, time.Since(start))
	}
}

// BenchmarkHandlerIPKey is one allowed request through the handler, keyed
// by client IP: the cost the handler adds in front of every request. Each
// request has a fresh replacer, as in Caddy, so what the handler makes it
// allocate is counted.
func BenchmarkHandlerIPKey(b *testing.B) {
	h := provisionHandler(b, "rate_limit {\n zone z {\n  key ip\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n}")
	r, _ := newKeyRequest("198.51.100.9", nil)
	benchServeFresh(b, h, []*http.Request{r})
}

// TestCleanupStopsGoroutines provisions handlers with a memory zone of
// every algorithm, one with tiers, and the sweeper, serves a request
// through them, and checks that Cleanup leaves no goroutine of theirs
// running. Redis zones start goroutines of go-redis and of their own
// (slot renewal, lease give-backs); those are checked in a real Caddy by
// TestRedisHandlerNoGoroutineLeak in e2e/, since a test here starts no
// redis-server.
func TestCleanupStopsGoroutines(t *testing.T) {
	checkGoroutines := testutil.GoroutineCheck(t)
	for i := range 5 {
		h := new(Handler)
		var input strings.Builder
		input.WriteString("rate_limit {\n sweep_interval 1s\n")
		for _, alg := range []string{"sliding_window_log", "sliding_window_counter", "fixed_window", "token_bucket", "leaky_bucket", "concurrency"} {
			fmt.Fprintf(&input, " zone leak_%d_%s {\n  algorithm %s\n  rate 5/s\n }\n", i, alg, alg)
		}
		fmt.Fprintf(&input, " zone leak_%d_tiers {\n  rate 5/s\n  tier {http.request.header.X-Plan} {\n   pro 10/s\n  }\n }\n}", i)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input.String())); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		r, _ := newKeyRequest("198.51.100.30", map[string]string{"X-Plan": "pro"})
		if _, code := serve(h, r, okHandler); code != http.StatusOK {
			t.Fatalf("status %d, want every zone to admit", code)
		}
		time.Sleep(5 * time.Millisecond) // the sweeper is running (sweep_interval is at least 1s, so it has not swept)
		if err := h.Cleanup(); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	checkGoroutines()
}

// TestDenialLog: a refusal is logged at debug level, with its zone, when
// the logger takes debug lines, and costs no logging call otherwise.
func TestDenialLog(t *testing.T) {
	for _, level := range []zapcore.Level{zapcore.DebugLevel, zapcore.InfoLevel} {
		h := provisionHandler(t, "rate_limit {\n zone denial_log_"+level.String()+" {\n  events 1\n  window 1m\n }\n}")
		core, logs := observer.New(level)
		h.useLogger(zap.New(core))
		serveAll(t, h, "198.51.100.60", []int{200, 429}, nil)
		got := logs.FilterMessage("rate limit exceeded").All()
		if level == zapcore.InfoLevel {
			if len(got) != 0 {
				t.Errorf("info level: %d denial lines, want none", len(got))
			}
			continue
		}
		if len(got) != 1 || got[0].ContextMap()["zone"] != "denial_log_debug" {
			t.Errorf("debug level: denial lines %v, want one for zone denial_log_debug", got)
		}
	}
}

// TestConcurrencySlotFreedOnPanic: a handler further down that panics
// still frees the request's concurrency slot as the panic passes by.
func TestConcurrencySlotFreedOnPanic(t *testing.T) {
	h := provisionHandler(t, "rate_limit {\n zone panic_slot {\n  algorithm concurrency\n  events 1\n  window 1m\n }\n}")
	boom := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("upstream handler bug") })
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		serveFrom(h, "198.51.100.61", boom)
	}()
	serveAll(t, h, "198.51.100.61", []int{200}, nil)
}

func TestTiersPickLimitAndKeepStateApart(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone tiered {
			key header X-API-Key
			algorithm fixed_window
			rate 1/1h
			tier {http.request.header.X-Plan} {
				free 2/1h
				pro 4/1h
			}
		}
	}`)
	send := func(key, plan string) (int, string) {
		code, hdr := servePlan(h, "198.51.100.20", plan, map[string]string{"X-API-Key": key})
		return code, hdr.Get("RateLimit-Policy")
	}
	for _, tc := range []struct {
		plan   string
		allow  int
		policy string
	}{
		{"free", 2, `"tiered";q=2;w=3600`},
		{"pro", 4, `"tiered";q=4;w=3600`},
		{"gold", 1, `"tiered";q=1;w=3600`}, // not listed: the zone's own limit
		{"", 1, `"tiered";q=1;w=3600`},
	} {
		key := "k-" + tc.plan
		for i := 0; i <= tc.allow; i++ {
			code, policy := send(key, tc.plan)
			want := 200
			if i == tc.allow {
				want = 429
			}
			if code != want || policy != tc.policy {
				t.Fatalf("plan %q request %d: %d %q, want %d %q", tc.plan, i, code, policy, want, tc.policy)
			}
		}
	}
	// The same key on another tier has state of its own.
	if code, _ := send("k-free", "pro"); code != 200 {
		t.Fatalf("k-free on the pro tier shared the free tier's state: %d", code)
	}
}

func TestFailModesWhenRedisIsUnreachable(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	for _, tc := range []struct {
		fail      string
		codes     []int
		retry     string
		rlHeaders bool
	}{
		{"open", []int{200, 200, 200}, "", false},
		{"closed", []int{503, 503}, "1", false},
		{"local", []int{200, 200, 429}, "", true},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			h := provisionHandler(t, `rate_limit {
				zone fail_`+tc.fail+` {
					rate 2/1h
					store redis
					fail `+tc.fail+`
				}
				redis {
					addresses `+addr+`
					timeout 200ms
				}
			}`)
			for i, want := range tc.codes {
				w, code := serveFrom(h, "198.51.100.21", okHandler)
				if code != want {
					t.Fatalf("request %d: %d, want %d", i, code, want)
				}
				if got := w.Header().Get("Retry-After"); code != 429 && got != tc.retry {
					t.Fatalf("request %d: Retry-After %q, want %q", i, got, tc.retry)
				}
				if has := w.Header().Get("RateLimit") != ""; has != tc.rlHeaders {
					t.Fatalf("request %d: rate-limit headers present=%v, want %v", i, has, tc.rlHeaders)
				}
			}
		})
	}
}

// TestClientLeftWhileQueuedForLeaseIsNoStoreFailure: a client that
// leaves while its request waits in a leased Redis zone's queue (behind
// another key's lease call to a Redis that is slow to answer) is not a
// store failure: store_failures_total does not count it, and no fail mode
// applies (no 503 to nobody, no unit taken from fail local's fallback, no
// request passed on unlimited by fail open). The request ends as a held
// one whose client left does, with 499 and what the other zones took
// given back. (The Redis breaker ignores such calls as well.)
func TestClientLeftWhileQueuedForLeaseIsNoStoreFailure(t *testing.T) {
	srv := redistest.Start(t)
	for i, fail := range []string{"open", "closed", "local"} {
		t.Run(fail, func(t *testing.T) {
			mem, remote := "left_mem_"+fail, "left_redis_"+fail
			h := provisionHandler(t, rateLimitConfig(zoneConfig(mem, "key ip", "rate 5/1h"),
				zoneConfig(remote, "key ip", "rate 50/1h", "store redis", "local_quota 0.5", "fail "+fail),
				redisConfig(srv.Addr(), "timeout 10s")))
			busy, ip := fmt.Sprintf("198.51.100.%d", 170+i), fmt.Sprintf("198.51.100.%d", 160+i)
			fails := counterValue(t, handlerZone(t, h, remote).metrics.storeFailures)
			var reached bool
			next := noteReached(&reached)

			// One key's lease call waits for a paused Redis; the next
			// request, another key's, queues behind it and leaves.
			srv.Pause()
			first := make(chan int, 1)
			go func() { _, code := serveFrom(h, busy, okHandler); first <- code }()
			time.Sleep(200 * time.Millisecond)
			r, _ := newKeyRequest(ip, nil)
			ctx, cancel := context.WithCancel(r.Context())
			time.AfterFunc(200*time.Millisecond, cancel)
			w, code := serve(h, r.WithContext(ctx), next)
			srv.Resume()
			if c := <-first; c != 200 {
				t.Errorf("the request whose lease call was under way: %d, want 200", c)
			}

			wantClientLeft(t, code, reached)
			if got := w.Header().Get("Retry-After"); got != "" {
				t.Errorf("Retry-After %q for a client that left", got)
			}
			if got := counterValue(t, handlerZone(t, h, remote).metrics.storeFailures) - fails; got != 0 {
				t.Errorf("store_failures_total counted %v for a client that left", got)
			}
			if got := storeRemaining(t, h, mem, ip); got != 5 {
				t.Errorf("%s: %d left, want 5: the unit the request took was not given back", mem, got)
			}
			if fb := handlerZone(t, h, remote).limit.fallback; fb != nil {
				if d, err := fb.Peek(context.Background(), ip); err != nil || d.Remaining != 50 {
					t.Errorf("fail local's fallback: %+v, %v; want 50 left: it decided for a client that left", d, err)
				}
			}
		})
	}
}

// TestClientLeftWhileRedisDecidedGivesBack: a Redis call runs to its
// answer even when the request's client leaves meanwhile (the store does
// not follow the client's cancellation). A request whose client left by
// the time Redis admitted it ends with 499 instead of going on to the
// next handler, and what it took, in Redis and in the other zones, goes
// back, as for a client that leaves while held.
func TestClientLeftWhileRedisDecidedGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	const mem, remote, ip = "gone_mem", "gone_redis", "198.51.100.180"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(mem, "key ip", "rate 5/1h"),
		zoneConfig(remote, "key ip", "rate 5/1h", "store redis"),
		redisConfig(srv.Addr(), "timeout 10s")))
	var reached bool
	next := noteReached(&reached)

	srv.Pause()
	r, _ := newKeyRequest(ip, nil)
	ctx, cancel := context.WithCancel(r.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	time.AfterFunc(400*time.Millisecond, srv.Resume)
	_, code := serve(h, r.WithContext(ctx), next)

	wantClientLeft(t, code, reached)
	for _, z := range []string{mem, remote} {
		if got := storeRemaining(t, h, z, ip); got != 5 {
			t.Errorf("%s: %d left, want 5: what the request took was not given back", z, got)
		}
	}
}

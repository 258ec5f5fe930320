package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// shapedUpstream answers on demand: the status in the query's status
// (default 200) and, when tokens is set, that many tokens in
// X-Tokens-Used, as a header or, with trailer=1, as a trailer after a
// body streamed in two flushed parts. It counts the requests that reach it.
type shapedUpstream struct {
	addr    string
	arrived atomic.Int64
	// delay holds each request, so requests sent at once are in flight
	// together.
	delay time.Duration
}

func newShapedUpstream(t *testing.T, delay time.Duration) *shapedUpstream {
	u := &shapedUpstream{delay: delay}
	u.addr = newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.arrived.Add(1)
		time.Sleep(u.delay)
		q := r.URL.Query()
		status, _ := strconv.Atoi(q.Get("status"))
		if status == 0 {
			status = http.StatusOK
		}
		tokens := q.Get("tokens")
		if q.Get("trailer") == "1" {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, "data: first\n\n")
			_ = http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "data: second\n\n")
			w.Header().Set("X-Tokens-Used", tokens)
			return
		}
		if tokens != "" {
			w.Header().Set("X-Tokens-Used", tokens)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "upstream")
	}))
	return u
}

// exchange is one request with its trailers read.
func exchange(t *testing.T, c *http.Client, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp, string(body)
}

// TestExampleLoginProtection runs examples/login.Caddyfile: any number of
// successful logins pass; the 6th failure in the window gets 429, and so
// does everything after it; failures sent at once never pass more than 5.
func TestExampleLoginProtection(t *testing.T) {
	t.Parallel()
	up := newShapedUpstream(t, 0)
	inst := startExample(t, "login.Caddyfile", up.addr)
	c := newClient(t)
	for i := range 20 {
		if r := get(t, c, inst.URL("/login")); r.code != 200 {
			t.Fatalf("successful login %d: status %d", i+1, r.code)
		}
	}
	for i := range 5 {
		if r := get(t, c, inst.URL("/login?status=401")); r.code != 401 {
			t.Fatalf("failed login %d: status %d, want 401 from the app", i+1, r.code)
		}
		if r := get(t, c, inst.URL("/login")); i < 4 && r.code != 200 {
			t.Fatalf("successful login after %d failures: status %d", i+1, r.code)
		}
	}
	r := get(t, c, inst.URL("/login?status=401"))
	if r.code != 429 {
		t.Fatalf("6th failed login: status %d, want 429", r.code)
	}
	if retry, _ := strconv.Atoi(r.header.Get("Retry-After")); retry < 14*60 {
		t.Errorf("Retry-After %q, want about 15 minutes", r.header.Get("Retry-After"))
	}
	if r := get(t, c, inst.URL("/login")); r.code != 429 {
		t.Errorf("a login after 5 failures: status %d, want 429", r.code)
	}
	if r := get(t, c, inst.URL("/elsewhere?status=401")); r.code != 401 {
		t.Errorf("outside /login: status %d, want the app's 401", r.code)
	}

	// At once: 40 failures held by the app, from one client.
	slow := newShapedUpstream(t, 200*time.Millisecond)
	inst = startExample(t, "login.Caddyfile", slow.addr)
	codes := parallelCodes(c, inst.URL("/login?status=401"), 40)
	if codes[401] != 5 || codes[429] != 35 || slow.arrived.Load() != 5 {
		t.Fatalf("40 failed logins at once: statuses %v, %d reached the app; want 5 × 401 and 35 × 429", codes, slow.arrived.Load())
	}
}

// topUp checks that what a burst left of a limit is there once the leases
// are back: it waits until every lease has gone back to Redis and every
// cached refusal has lapsed, then sends failures to url one after another,
// and returns how many of them passed (any status but 429) before the
// first refusal, refusing more than want. A burst against leases may leave
// units in a lease that requests refused from the denial cache meanwhile
// could not reach (fewer admitted, never more); this shows none was lost.
func topUp(t *testing.T, c *http.Client, url string, want int, headers ...string) int {
	t.Helper()
	if want > 0 {
		time.Sleep(leaseLifetime + denyCacheDefault + 200*time.Millisecond)
	}
	passed := 0
	for range want + 1 {
		if r := get(t, c, url, headers...); r.code == http.StatusTooManyRequests {
			break
		}
		passed++
	}
	return passed
}

// parallelCodes sends n GETs to url at once and counts their statuses; a
// transport error counts as status 0.
func parallelCodes(c *http.Client, url string, n int, headers ...string) map[int]int {
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := send(c, http.MethodGet, url, headers...)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[0]++
				return
			}
			codes[r.code]++
		}()
	}
	wg.Wait()
	return codes
}

// TestExampleLLMGateway runs examples/llm-gateway.Caddyfile: the tokens an
// answer reports, in a header or a trailer after a streamed body, are what
// the key pays; the field never reaches the client; a key that spent its
// minute's tokens is refused.
func TestExampleLLMGateway(t *testing.T) {
	t.Parallel()
	up := newShapedUpstream(t, 0)
	inst := startExample(t, "llm-gateway.Caddyfile", up.addr)
	c := newClient(t)
	// remaining is the key's X-RateLimit-Remaining after one more request
	// (which takes 1000 up front) plus those 1000: what the earlier
	// requests left, and the refill since (100,000 a minute is 1,667 a
	// second) on top.
	remaining := func(key string) int {
		resp, _ := exchange(t, c, inst.URL("/v1/chat?tokens=1000"), "X-API-Key", key)
		n, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining"))
		if resp.StatusCode != 200 || err != nil {
			t.Fatalf("key %s: status %d, X-RateLimit-Remaining %q", key, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
		}
		return n + 1000
	}
	within := func(what string, got, want int) {
		t.Helper()
		if got < want || got > want+2000 {
			t.Errorf("%s: %d tokens left, want %d (plus at most a second's refill)", what, got, want)
		}
	}

	resp, _ := exchange(t, c, inst.URL("/v1/chat?tokens=30000"), "X-API-Key", "header")
	if resp.StatusCode != 200 || resp.Header.Get("X-Tokens-Used") != "" {
		t.Fatalf("status %d, X-Tokens-Used %q: want 200 and the header removed", resp.StatusCode, resp.Header.Get("X-Tokens-Used"))
	}
	within("after an answer of 30,000 tokens in a header", remaining("header"), 70000)

	resp, body := exchange(t, c, inst.URL("/v1/chat?tokens=45000&trailer=1"), "X-API-Key", "trailer")
	if resp.StatusCode != 200 || !strings.Contains(body, "second") {
		t.Fatalf("streamed answer: status %d, body %q", resp.StatusCode, body)
	}
	if v := resp.Trailer.Get("X-Tokens-Used"); v != "" {
		t.Errorf("the X-Tokens-Used trailer reached the client: %q", v)
	}
	within("after a streamed answer of 45,000 tokens in a trailer", remaining("trailer"), 55000)

	exchange(t, c, inst.URL("/v1/chat?tokens=200"), "X-API-Key", "small")
	within("after an answer of 200 tokens (800 of the 1,000 given back)", remaining("small"), 99800)

	// An answer above the minute's tokens costs the minute's tokens: the
	// key has nothing left.
	exchange(t, c, inst.URL("/v1/chat?tokens=250000"), "X-API-Key", "big")
	if resp, _ := exchange(t, c, inst.URL("/v1/chat"), "X-API-Key", "big"); resp.StatusCode != 429 {
		t.Errorf("after an answer of 250,000 tokens: status %d, want 429", resp.StatusCode)
	}
	if resp, _ := exchange(t, c, inst.URL("/v1/chat")); resp.StatusCode != 429 {
		t.Errorf("without an API key: status %d, want 429 (missing_key deny)", resp.StatusCode)
	}
}

// TestShapedRedisLeasesTiersAndZones: count_response and response_cost on
// redis zones with local_quota, beside a memory zone, with tiers. Failures
// sent at once never pass more than the tier's limit; successes pass and
// count only in the zone that counts every request; a response's cost is
// charged to Redis past what the instance's lease holds.
func TestShapedRedisLeasesTiersAndZones(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newShapedUpstream(t, 100*time.Millisecond)
	cfg := globals + fmt.Sprintf(`
http://{{http}} {
	rate_limit {
		zone every_request {
			key header X-Client
			algorithm fixed_window
			rate 1000/1h
		}
		zone failures {
			key header X-Client
			algorithm sliding_window_counter
			rate 3/1h
			store redis
			local_quota 0.5
			count_response {
				status 4xx
			}
			tier {http.request.header.X-Plan} {
				gold 6/1h
			}
		}
		zone tokens {
			match {
				path /tokens
			}
			key header X-Client
			algorithm fixed_window
			rate 1000/1h
			store redis
			local_quota 0.2
			cost 10
			response_cost X-Tokens-Used
		}
		redis {
			url redis://%s
			timeout %s
		}
	}
	reverse_proxy %s
}
`, srv.Addr(), redisTimeout, up.addr)
	inst := caddyproc.Start(t, cfg)
	observer := startObserver(t, cfg)
	c := newClient(t)
	awayFromBoundary(t, time.Hour, time.Minute)

	for _, plan := range []struct {
		name  string
		limit int
	}{{"", 3}, {"gold", 6}} {
		client := "c-" + plan.name
		// One after another: a success in flight holds its unit until
		// its response is known.
		for i := range 30 {
			if r := get(t, c, inst.URL("/?status=200"), "X-Client", client, "X-Plan", plan.name); r.code != 200 {
				t.Fatalf("plan %q: success %d: status %d", plan.name, i+1, r.code)
			}
		}
		codes := parallelCodes(c, inst.URL("/?status=403"), 30, "X-Client", client, "X-Plan", plan.name)
		if codes[403] > plan.limit || codes[403]+codes[429] != 30 {
			t.Fatalf("plan %q: 30 failures at once: %v, want at most %d × 403 and the rest 429", plan.name, codes, plan.limit)
		}
		passed := codes[403] + topUp(t, c, inst.URL("/?status=403"), plan.limit-codes[403], "X-Client", client, "X-Plan", plan.name)
		if passed != plan.limit {
			t.Fatalf("plan %q: %d failures passed in all, want exactly %d", plan.name, passed, plan.limit)
		}
		// every_request counts every request admitted: the 30 successes
		// and the failures that passed. The refused failures gave back
		// what it took of them. This one is refused as well.
		r := get(t, c, inst.URL("/?status=200"), "X-Client", client, "X-Plan", plan.name)
		if want := fmt.Sprintf(`"every_request";r=%d;`, 1000-30-plan.limit); r.code != 429 || !strings.Contains(r.header.Get("RateLimit"), want) {
			t.Fatalf("plan %q: status %d, RateLimit %q; want 429 and %s", plan.name, r.code, r.header.Get("RateLimit"), want)
		}
	}

	// 300 tokens reported: Redis holds them, though the lease held 200.
	resp, _ := exchange(t, c, inst.URL("/tokens?tokens=300"), "X-Client", "global")
	if resp.StatusCode != 200 || resp.Header.Get("X-Tokens-Used") != "" {
		t.Fatalf("tokens: status %d, X-Tokens-Used %q", resp.StatusCode, resp.Header.Get("X-Tokens-Used"))
	}
	var st keyReport
	waitFor := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if code := adminCall(t, observer, http.MethodGet, "/rate_limit/zones/tokens?key=global", &st); code != 200 {
				t.Fatalf("inspect: %d", code)
			}
			if st.Limit-st.Remaining == want || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := st.Limit - st.Remaining; got != want {
			t.Fatalf("Redis counts %d tokens taken, want %d", got, want)
		}
	}
	// Once the lease is given back (a second at most), Redis counts the
	// 300 the answer reported, and nothing else.
	waitFor(300)
}

// TestCountResponseAcrossInstances: three Caddy processes with leases on
// one Redis, a count_response zone of 20 failures an hour. Successes, one
// after another over all three, pass and count nothing (the three leases
// together hold at most 12 units, so some are always left in Redis); then
// 60 failures at once, spread over the three and held by the app, pass 20
// and no more, however the leases were spread when the burst began.
func TestCountResponseAcrossInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newShapedUpstream(t, 200*time.Millisecond)
	var routes []redisRoute
	for _, alg := range []string{"sliding_window_log", "fixed_window", "token_bucket", "sliding_window_counter"} {
		routes = append(routes, redisRoute{
			path:     "/" + alg,
			zone:     "key global\nalgorithm " + alg + "\nrate 20/1h\nlocal_quota 0.2\nfail closed\ncount_response {\nstatus 401\n}",
			upstream: up.addr,
		})
	}
	cfg := redisSite(redisURLBlock(srv.Addr(), redisTimeout), routes...)
	insts := []*caddyproc.Instance{caddyproc.Start(t, cfg), caddyproc.Start(t, cfg), caddyproc.Start(t, cfg)}
	c := newClient(t)
	awayFromBoundary(t, time.Hour, time.Minute)
	for _, route := range routes {
		before := up.arrived.Load()
		for i := range 12 {
			if r := get(t, c, insts[i%3].URL(route.path+"?status=200")); r.code != 200 {
				t.Fatalf("%s: success %d on instance %d: status %d", route.path, i+1, i%3, r.code)
			}
		}
		var urls []string
		for _, inst := range insts {
			urls = append(urls, inst.URL(route.path+"?status=401"))
		}
		b := burst(c, urls, 60)
		failures := int(up.arrived.Load() - before - 12)
		if len(b.errs) > 0 || failures > 20 || b.denied != 60-failures {
			t.Errorf("%s: 60 failures at once over three instances: %d reached the app, %d refused, other statuses %v, errors %v; want at most 20, the rest refused",
				route.path, failures, b.denied, b.other, firstErr(b.errs))
			continue
		}
		if passed := failures + topUp(t, c, urls[0], 20-failures); passed != 20 {
			t.Errorf("%s: %d failures passed in all, want exactly 20", route.path, passed)
		}
	}
}

package ratelimit

// Tests of count_response (only the responses that match are counted; the
// others' units are given back), of a per-request cost, and of the JSON
// and refusals of these shapes.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestCountResponseCountsOnlyMatches: any number of successes pass; the
// N+1th failure in the window is refused, whatever came between.
func TestCountResponseCountsOnlyMatches(t *testing.T) {
	for _, alg := range []string{"fixed_window", "token_bucket", "sliding_window_log", "sliding_window_counter"} {
		t.Run(alg, func(t *testing.T) {
			h := provisionHandler(t, rateLimitConfig(zoneConfig("logins", "algorithm "+alg, "rate 3/1h", "count_response {", "status 401 403", "}")))
			ip := "198.51.100.40"
			send := func(next caddyhttp.Handler) int {
				_, code := serveFrom(h, ip, next)
				return code
			}
			for i := range 10 {
				if code := send(answer(200)); code != 200 {
					t.Fatalf("success %d: status %d", i+1, code)
				}
			}
			for i := range 2 {
				if code := send(answer(401)); code != 401 {
					t.Fatalf("failure %d: status %d, want 401", i+1, code)
				}
				if code := send(answer(200)); code != 200 {
					t.Fatalf("success after failure %d: status %d", i+1, code)
				}
			}
			if code := send(answer(401)); code != 401 {
				t.Fatalf("failure 3: status %d, want 401", code)
			}
			// Spent: every request needs a unit up front, so after the
			// third failure none passes, a login that would succeed
			// included, until the window lets one go.
			if code := send(answer(401)); code != 429 {
				t.Fatalf("the 4th failure: status %d, want 429", code)
			}
			if code := send(answer(200)); code != 429 {
				t.Fatalf("a request after 3 failures: status %d, want 429", code)
			}
		})
	}
}

// TestCountResponseHeadersAndErrors: a header match counts, and a handler
// error counts by the status Caddy will answer with.
func TestCountResponseHeadersAndErrors(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("z", "algorithm fixed_window", "rate 2/1h", "count_response {", "status 5xx", "header X-Login-Failed", "}")))
	fails := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("upstream down"))
	})
	r, _ := newKeyRequest("198.51.100.41", nil)
	// 5xx without the header does not match: both must match.
	if _, code := serve(h, r, fails); code != 502 {
		t.Fatalf("status %d", code)
	}
	w, _ := serveFrom(h, "198.51.100.41", answer(200, "X-Login-Failed", "1"))
	if got := remainingIn(t, w.Header(), "z"); got != "1" {
		t.Fatalf("remaining %s after an uncounted 502: want 1 (the up-front unit)", got)
	}
	w, _ = serveFrom(h, "198.51.100.41", answer(200))
	if got := remainingIn(t, w.Header(), "z"); got != "1" {
		t.Fatalf("remaining %s: neither response matched, want 1", got)
	}

	h = provisionHandler(t, rateLimitConfig(zoneConfig("e", "algorithm fixed_window", "rate 1/1h", "count_response {", "status 502", "}")))
	for i, want := range []int{502, 429} {
		if _, code := serveFrom(h, "198.51.100.42", fails); code != want {
			t.Fatalf("request %d: status %d, want %d", i+1, code, want)
		}
	}
}

// TestCountResponseParallelNeverOvershoots: failures that run at once take
// their units up front, so no more than the limit of them pass.
func TestCountResponseParallelNeverOvershoots(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("logins", "algorithm sliding_window_log", "rate 5/1h", "count_response {", "status 401", "}")))
	var passed atomic.Int64
	slow401 := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		passed.Add(1)
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusUnauthorized)
		return nil
	})
	var wg sync.WaitGroup
	serveInParallel(&wg, h, "198.51.100.43", 50, slow401)
	wg.Wait()
	if n := passed.Load(); n != 5 {
		t.Fatalf("%d failures reached the upstream, want exactly 5", n)
	}
}

// TestRequestCostPlaceholder: each request takes the cost its placeholder
// gives; a value that is not an integer from 0 to the quota is refused
// with 400 and takes nothing; 0 passes while a unit is left.
func TestRequestCostPlaceholder(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("batch", "algorithm fixed_window", "rate 10/1h", "cost {http.request.header.X-Batch-Size}")))
	send := func(size string) (http.Header, int) {
		hdr := map[string]string{}
		if size != "<none>" {
			hdr["X-Batch-Size"] = size
		}
		r, _ := newKeyRequest("198.51.100.44", hdr)
		w, code := serve(h, r, okHandler)
		return w.Header(), code
	}
	hdr, code := send("3")
	if code != 200 || remainingIn(t, hdr, "batch") != "7" || hdr.Get("X-RateLimit-Remaining") != "7" {
		t.Fatalf("cost 3: status %d, RateLimit %q", code, hdr.Get("RateLimit"))
	}
	for _, bad := range []string{"<none>", "", "abc", "-1", "1.5", "11", "99999999999999999999", " 2"} {
		if _, code := send(bad); code != 400 {
			t.Errorf("cost %q: status %d, want 400", bad, code)
		}
	}
	hdr, code = send("0")
	if code != 200 || remainingIn(t, hdr, "batch") != "7" {
		t.Fatalf("cost 0: status %d, RateLimit %q; want 200 and nothing taken", code, hdr.Get("RateLimit"))
	}
	if hdr, code = send("7"); code != 200 || remainingIn(t, hdr, "batch") != "0" {
		t.Fatalf("cost 7: status %d, RateLimit %q", code, hdr.Get("RateLimit"))
	}
	if _, code = send("0"); code != 429 {
		t.Fatalf("cost 0 on a spent key: status %d, want 429", code)
	}
}

// TestRequestCostAgainstTier: the bound on a per-request cost is the
// quota of the limit that applies, a tier's included.
func TestRequestCostAgainstTier(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("batch", "algorithm fixed_window", "rate 10/1h", "cost {http.request.header.X-Batch-Size}", "tier {http.request.header.X-Plan} {", "big 100/1h", "}")))
	r, _ := newKeyRequest("198.51.100.45", map[string]string{"X-Batch-Size": "50"})
	if _, code := serve(h, r, okHandler); code != 400 {
		t.Fatalf("cost 50 on the zone's limit of 10: status %d, want 400", code)
	}
	r, _ = newKeyRequest("198.51.100.45", map[string]string{"X-Batch-Size": "50", "X-Plan": "big"})
	if w, code := serve(h, r, okHandler); code != 200 || remainingIn(t, w.Header(), "batch") != "50" {
		t.Fatalf("cost 50 on the big tier: status %d, RateLimit %q", code, w.Header().Get("RateLimit"))
	}
}

// TestResponseShapedRefusedWhereUnsettled: concurrency and leaky_bucket
// cannot give units back by the response, nor owe; both are refused.
func TestResponseShapedRefusedWhereUnsettled(t *testing.T) {
	for _, tc := range []struct{ alg, option string }{
		{"concurrency", "count_response {\n status 401\n }"},
		{"leaky_bucket", "count_response {\n status 401\n }"},
		{"concurrency", "response_cost X-Tokens"},
		{"leaky_bucket", "response_cost X-Tokens"},
	} {
		input := fmt.Sprintf("rate_limit {\n zone z {\n  algorithm %s\n  rate 5/1s\n  %s\n }\n}", tc.alg, tc.option)
		_, err := parseDirective(t, input)
		name, _, _ := strings.Cut(tc.option, " ")
		want := fmt.Sprintf("zone z: %s applies only to token_bucket, fixed_window, sliding_window_log and sliding_window_counter, not %s, at Testfile:2", name, tc.alg)
		if err == nil || err.Error() != want {
			t.Errorf("%s with %s: %v, want %q", tc.alg, name, err, want)
		}
	}
}

// BenchmarkHandlerShapes is one allowed request through a zone that
// settles its cost by the response, against the same zone without: what
// count_response (a response that does not count, so its unit is given
// back), a cost placeholder and response_cost add per request:
// response_cost with a reported cost one above the up-front one, so one
// more unit is charged (a second store operation, which any request whose
// cost changes needs), and with the cost taken up front, which settles
// nothing. Every variant's upstream writes the same header.
func BenchmarkHandlerShapes(b *testing.B) {
	const zone = "rate_limit {\n zone z {\n  key ip\n  algorithm token_bucket\n  rate 1000000000/1s\n%s }\n}"
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Tokens", "2")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	for _, tc := range []struct{ name, options string }{
		{"plain", ""},
		{"count_response", "  count_response {\n   status 401\n  }\n"},
		{"cost_placeholder", "  cost {http.request.header.X-Cost}\n"},
		{"response_cost", "  response_cost X-Tokens\n"},
		{"response_cost_as_taken", "  cost 2\n  response_cost X-Tokens\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := provisionHandler(b, fmt.Sprintf(zone, tc.options))
			base, _ := newKeyRequest("198.51.100.9", map[string]string{"X-Cost": "1"})
			benchServeFreshTo(b, h, []*http.Request{base}, next)
		})
	}
}

// TestShapesJSON: the JSON forms of cost, count_response and
// response_cost, as `caddy adapt` writes them and as an operator may, and
// their refusals, which name the zone as the Caddyfile's do.
func TestShapesJSON(t *testing.T) {
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, _, err := adapter.Adapt([]byte(`:8080 {
	rate_limit {
		zone a {
			rate 5/1m
			cost 2
			count_response {
				status 4xx 503
				header X-Login-Failed
			}
		}
		zone b {
			algorithm token_bucket
			rate 100/1m
			cost {http.request.header.X-Estimate}
			response_cost X-Tokens keep
		}
	}
	respond "ok"
}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantAdapted(t, out,
		`"cost":2,`,
		`"count_response":{"headers":{"X-Login-Failed":[]},"status_code":[4,503]}`,
		`"cost":"{http.request.header.X-Estimate}"`,
		`"response_cost":{"header":"X-Tokens","keep":true}`,
	)
	for _, tc := range []struct{ zone, want string }{
		{`"cost":"3"`, ""},
		{`"cost":"{vars.cost}","count_response":{"status_code":[401]},"response_cost":{"header":"X-T"}`, ""},
		{`"cost":"many"`, `zone "z": cost must be a positive integer or a placeholder, got "many"`},
		{`"cost":-1`, `zone "z": cost must be positive, got -1`},
		{`"cost":"{vars.cost"`, `zone "z": cost: unclosed placeholder`},
		{`"count_response":{}`, `zone "z": count_response needs a status or a header to match`},
		{`"count_response":{"status_code":[7]}`, `zone "z": count_response: status 7 is neither a code`},
		{`"response_cost":{"header":""}`, `zone "z": response_cost needs a header name`},
		{`"response_cost":{"header":"X T"}`, `zone "z": response_cost: "X T" is not a header field name`},
		{`"algorithm":"concurrency","count_response":{"status_code":[401]}`, `zone "z": count_response applies only to`},
		{`"algorithm":"leaky_bucket","response_cost":{"header":"X"}`, `zone "z": response_cost applies only to`},
	} {
		var h Handler
		raw := fmt.Sprintf(`{"rate_limits":{"z":{"max_events":5,"window":"1m",%s}}}`, tc.zone)
		if err := json.Unmarshal([]byte(raw), &h); err != nil {
			t.Fatalf("%s: %v", tc.zone, err)
		}
		err := h.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.zone, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("%s: refusal %v, want one starting %q", tc.zone, err, tc.want)
		}
	}
	var h Handler
	if err := json.Unmarshal([]byte(`{"rate_limits":{"z":{"max_events":5,"window":"1m","cost":[1]}}}`), &h); err == nil {
		t.Error("a cost that is a list was accepted")
	}
}

// TestCountResponseHeldClientLeavesGivesBack: a request held by a
// leaky_bucket zone whose client leaves during the hold got no response,
// so a count_response zone that took its unit gives it back, as for any
// request aborted before its response. (The hold's failure released only
// what releases on finish: the login zone kept the unit, 1 of 3 left
// instead of 2, locking out clients whose requests never reached the app.)
func TestCountResponseHeldClientLeavesGivesBack(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("held_leave_a", "key ip", "algorithm leaky_bucket", "rate 1/1m", "max_delay 1h"), zoneConfig("held_leave_b", "key ip", "algorithm fixed_window", "rate 3/1h", "count_response {", "status 401", "}")))
	const ip = "198.51.100.93"
	if _, code := serveFrom(h, ip, answer(401)); code != 401 {
		t.Fatalf("first request: %d", code)
	}
	r, _ := newKeyRequest(ip, nil)
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Millisecond)
	defer cancel()
	if _, code := serve(h, r.WithContext(ctx), answer(401)); code != statusClientClosedRequest {
		t.Fatalf("held request whose client left: %d, want %d", code, statusClientClosedRequest)
	}
	d, err := handlerZone(t, h, "held_leave_b").limit.store.Peek(context.Background(), ip)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 2 {
		t.Fatalf("count_response zone after a 401 and a request whose client left while held: %d left, want 2", d.Remaining)
	}
}

// TestDryRunBadCostNeverRefuses: a dry_run zone whose cost placeholder is
// missing or invalid lets the request through (dry_run never refuses,
// whatever else the zone says), counting it as dry_run_denied.
func TestDryRunBadCostNeverRefuses(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("dry_bad_cost", "algorithm fixed_window", "rate 10/1h", "cost {http.request.header.X-Batch-Size}", "dry_run")))
	for _, v := range []string{"<none>", "abc", "11"} {
		hdr := map[string]string{}
		if v != "<none>" {
			hdr["X-Batch-Size"] = v
		}
		r, _ := newKeyRequest("198.51.100.202", hdr)
		if _, code := serve(h, r, okHandler); code != http.StatusOK {
			t.Errorf("dry_run zone, cost %q: status %d, want 200 (dry_run never refuses)", v, code)
		}
	}
}

// TestCountResponseAbortedNotCounted: a request whose handler aborts before
// writing a response (a panic, which net/http turns into a closed
// connection; reverse_proxy panics with http.ErrAbortHandler) matched no
// status, so its unit is given back.
func TestCountResponseAbortedNotCounted(t *testing.T) {
	h := provisionHandler(t, rateLimitConfig(zoneConfig("cr_abort", "algorithm fixed_window", "rate 2/1h", "count_response {", "status 401", "}")))
	ip := "198.51.100.204"
	for range 2 {
		serveAborted(h, ip, aborts)
	}
	w, code := serveFrom(h, ip, answer(200))
	if code != http.StatusOK {
		t.Fatalf("after two aborted requests (no 401 answered): status %d, want 200", code)
	}
	if got := remainingIn(t, w.Header(), "cr_abort"); got != "1" {
		t.Fatalf("remaining %s, want 1 (only this request's up-front unit)", got)
	}
}

// TestCountResponseSettlesAcrossReload: a request admitted by a config
// that a reload replaces while it runs settles into the state the new
// config shares (same zone, same limit): its unit comes back once its
// response does not match, though its handler was cleaned up meanwhile.
func TestCountResponseSettlesAcrossReload(t *testing.T) {
	const cfg = `rate_limit {
		zone reload_logins {
			algorithm fixed_window
			rate 3/1h
			count_response {
				status 401
			}
		}
	}`
	old := provisionHandler(t, cfg)
	ip := "198.51.100.206"
	release, done := serveHeld(old, ip, "")
	newer := provisionHandler(t, cfg)
	w, _ := serveFrom(newer, ip, answer(200))
	if got := remainingIn(t, w.Header(), "reload_logins"); got != "1" {
		t.Fatalf("remaining %s while the old config's request holds its unit, want 1", got)
	}
	_ = old.Cleanup()
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the held request: status %d", code)
	}
	w, _ = serveFrom(newer, ip, answer(200))
	if got := remainingIn(t, w.Header(), "reload_logins"); got != "2" {
		t.Fatalf("remaining %s after the held request's 200 settled, want 2 (its unit given back)", got)
	}
}

// TestRequestCostCheckedBeforeAnyZoneDecides: every applying zone's cost
// is read before any zone decides, so a bad cost is answered 400 whether
// or not another zone would refuse, and whatever store the zones use.
func TestRequestCostCheckedBeforeAnyZoneDecides(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_first {
			key {remote_host}
			rate 1/1h
		}
		zone b_cost {
			key {remote_host}
			rate 10/1h
			cost {http.request.header.X-Cost}
		}
	}`)
	for i, tc := range []struct {
		cost string
		want int
	}{{"1", 200}, {"abc", 400}, {"1", 429}, {"11", 400}} {
		r, _ := newKeyRequest("198.51.100.90", map[string]string{"X-Cost": tc.cost})
		if _, code := serve(h, r, okHandler); code != tc.want {
			t.Fatalf("request %d (cost %q): status %d, want %d", i, tc.cost, code, tc.want)
		}
	}
}

// TestRequestCostNotReadAfterARefusalUnasked: a zone that refuses without
// asking a store (missing_key deny, an override's block) ends the reading
// of the zones (docs/shaped-limits.md, "Costs from the request"): a bad cost in a zone
// after it is never read, and the request is refused with 429.
func TestRequestCostNotReadAfterARefusalUnasked(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_ru_deny {
			key {http.request.header.X-Key}
			missing_key deny
			rate 10/1h
		}
		zone b_ru_badcost {
			key ip
			rate 10/1h
			cost {http.request.header.X-Cost}
		}
	}`)
	r, _ := newKeyRequest("198.51.100.163", map[string]string{"X-Cost": "abc"})
	if _, code := serve(h, r, okHandler); code != http.StatusTooManyRequests {
		t.Fatalf("missing key under deny, bad cost in a later zone: %d, want 429 (the deny ends the reading; docs/shaped-limits.md)", code)
	}
}

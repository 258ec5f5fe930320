package e2e

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// model is a stand-in LLM upstream: it answers its name, with the tokens
// the query asks for in X-Tokens-Used, and counts the requests it gets.
type model struct {
	addr     string
	requests atomic.Int64
}

func newModel(t *testing.T, name string) *model {
	m := &model{}
	m.addr = newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.requests.Add(1)
		if tokens := r.URL.Query().Get("tokens"); tokens != "" {
			w.Header().Set("X-Tokens-Used", tokens)
		}
		_, _ = io.WriteString(w, name)
	}))
	return m
}

// TestExampleLLMFallback runs examples/llm-fallback.Caddyfile as written,
// with two stand-in models: a key under its daily tokens is answered by
// the large model; once it has spent them it is answered by the small
// one (200, the rate-limit fields reporting the spent zone, no
// Retry-After, counted `passed` on /metrics); every request counts in
// the requests zone; the tokens field never reaches the client; a
// request without a key is refused.
func TestExampleLLMFallback(t *testing.T) {
	t.Parallel()
	large, small := newModel(t, "large"), newModel(t, "small")
	inst := startExample(t, "llm-fallback.Caddyfile", large.addr, [2]string{"localhost:9001", small.addr})
	c := newClient(t)
	chat := func(key, tokens string) response {
		t.Helper()
		var headers []string
		if key != "" {
			headers = []string{"X-API-Key", key}
		}
		return get(t, c, inst.URL("/v1/chat?tokens="+tokens), headers...)
	}
	want := func(what string, r response, body string, fields ...string) {
		t.Helper()
		if r.code != 200 || r.body != body {
			t.Fatalf("%s: %d %q, want 200 from the %s model", what, r.code, r.body, body)
		}
		if v := r.header.Get("X-Tokens-Used"); v != "" {
			t.Errorf("%s: X-Tokens-Used %q reached the client", what, v)
		}
		if v := r.header.Get("Retry-After"); v != "" {
			t.Errorf("%s: Retry-After %q", what, v)
		}
		for _, f := range fields {
			if !strings.Contains(r.header.Get("RateLimit"), f) {
				t.Errorf("%s: RateLimit %q, want %s", what, r.header.Get("RateLimit"), f)
			}
		}
	}

	// 1,000 tokens up front; the answer's 60,000 are what the key pays.
	want("under the quota", chat("k1", "60000"), "large", `"large_model";r=99000;`, `"requests";r=599;`)
	// 40,000 left (and a token or so of refill): the answer's 50,000
	// leave the key owing.
	want("with 40,000 left", chat("k1", "50000"), "large", `"requests";r=598;`)
	r := chat("k1", "30000")
	want("spent", r, "small", `"large_model";r=0;`, `"requests";r=597;`)
	if r.header.Get("X-RateLimit-Limit") != "100000" || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("spent: X-RateLimit-Limit %q, -Remaining %q; want the large model's 100000 and 0",
			r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"))
	}
	want("spent, again", chat("k1", "90000"), "small", `"large_model";r=0;`, `"requests";r=596;`)
	want("another key", chat("k2", "10"), "large", `"large_model";r=99000;`)
	if r := chat("", "10"); r.code != http.StatusTooManyRequests {
		t.Errorf("without an API key: status %d, want 429 (missing_key deny)", r.code)
	}
	if l, s := large.requests.Load(), small.requests.Load(); l != 3 || s != 2 {
		t.Errorf("the large model got %d requests and the small %d, want 3 and 2", l, s)
	}
	m := get(t, c, inst.Admin()+"/metrics")
	for _, line := range []string{
		`caddy_http_rate_limit_decisions_total{result="passed",zone="large_model"} 2`,
		`caddy_http_rate_limit_decisions_total{result="allowed",zone="large_model"} 3`,
		`caddy_http_rate_limit_decisions_total{result="allowed",zone="requests"} 5`,
	} {
		if !strings.Contains(m.body, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

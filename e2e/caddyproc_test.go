package e2e

// Tests of the harness that runs Caddy (internal/caddyproc): they start
// Caddy, so they live here with the tests that use it.

import (
	"net/http"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
)

// TestCaddyprocStartLoadStop covers an instance's life: two listeners on their own
// ports, a reload that changes what they answer, a refused reload that
// leaves the old config running, and a stop that closes the listeners.
func TestCaddyprocStartLoadStop(t *testing.T) {
	t.Parallel()
	cfg := globalsWith("") + `
http://{{http}} {
	respond "one"
}
http://{{http2}} {
	respond "two"
}
`
	inst := caddyproc.Start(t, cfg)
	c := newClient(t)
	if inst.Addr("http") == inst.Addr("http2") || inst.Addr("http") == inst.Addr("admin") {
		t.Fatalf("addresses are not distinct: http %s, http2 %s, admin %s", inst.Addr("http"), inst.Addr("http2"), inst.Addr("admin"))
	}
	if r := get(t, c, inst.URL("/")); r.code != 200 || r.body != "one" {
		t.Fatalf("{{http}}: got %d %q, want 200 \"one\"", r.code, r.body)
	}
	if r := get(t, c, inst.URLOn("http2", "/")); r.code != 200 || r.body != "two" {
		t.Fatalf("{{http2}}: got %d %q, want 200 \"two\"", r.code, r.body)
	}

	if err := inst.Load(strings.Replace(cfg, `"one"`, `"uno"`, 1)); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	if r := get(t, c, inst.URL("/")); r.code != 200 || r.body != "uno" {
		t.Fatalf("after Load: got %d %q, want 200 \"uno\"", r.code, r.body)
	}

	err := inst.Load(globalsWith("") + "http://{{http}} {\n\tno_such_directive\n}\n")
	if err == nil {
		t.Fatal("Load of an unknown directive succeeded")
	}
	if !strings.Contains(err.Error(), "no_such_directive") || !strings.Contains(err.Error(), "Caddyfile:8") {
		t.Errorf("Load error does not name the directive and line: %v", err)
	}
	if r := get(t, c, inst.URL("/")); r.code != 200 || r.body != "uno" {
		t.Fatalf("after a refused Load: got %d %q, want the old config's 200 \"uno\"", r.code, r.body)
	}
	if inst.Log() == "" {
		t.Error("Log is empty; caddy always logs at startup")
	}

	url := inst.URL("/")
	inst.Stop()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	if resp, err := client.Get(url); err == nil {
		resp.Body.Close()
		t.Fatalf("GET after Stop answered %s", resp.Status)
	}
	inst.Stop() // a second stop does nothing
}

// TestCaddyprocStartJSON runs a JSON config with the same placeholders.
func TestCaddyprocStartJSON(t *testing.T) {
	t.Parallel()
	inst := caddyproc.StartJSON(t, `{
  "admin": {"listen": "{{admin}}"},
  "apps": {"http": {"servers": {"s": {
    "listen": ["{{http}}"],
    "automatic_https": {"disable": true},
    "routes": [{"handle": [{"handler": "static_response", "body": "json"}]}]
  }}}}
}`)
	if r := get(t, newClient(t), inst.URL("/")); r.code != 200 || r.body != "json" {
		t.Fatalf("got %d %q, want 200 \"json\"", r.code, r.body)
	}
}

package caddyproc

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

const globals = `{
	admin {{admin}}
	default_bind 127.0.0.1
	auto_https off
	persist_config off
}
`

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestStartLoadStop covers an instance's life: two listeners on their own
// ports, a reload that changes what they answer, a refused reload that
// leaves the old config running, and a stop that closes the listeners.
func TestStartLoadStop(t *testing.T) {
	cfg := globals + `
http://{{http}} {
	respond "one"
}
http://{{http2}} {
	respond "two"
}
`
	inst := Start(t, cfg)
	if inst.Addr("http") == inst.Addr("http2") || inst.Addr("http") == inst.Addr("admin") {
		t.Fatalf("addresses are not distinct: %v", inst.addrs)
	}
	if code, body := get(t, inst.URL("/")); code != 200 || body != "one" {
		t.Fatalf("{{http}}: got %d %q, want 200 \"one\"", code, body)
	}
	if code, body := get(t, inst.URLOn("http2", "/")); code != 200 || body != "two" {
		t.Fatalf("{{http2}}: got %d %q, want 200 \"two\"", code, body)
	}

	if err := inst.Load(strings.Replace(cfg, `"one"`, `"uno"`, 1)); err != nil {
		t.Fatalf("Load: %v\n%s", err, inst.Log())
	}
	if code, body := get(t, inst.URL("/")); code != 200 || body != "uno" {
		t.Fatalf("after Load: got %d %q, want 200 \"uno\"", code, body)
	}

	err := inst.Load(globals + "http://{{http}} {\n\tno_such_directive\n}\n")
	if err == nil {
		t.Fatal("Load of an unknown directive succeeded")
	}
	if !strings.Contains(err.Error(), "no_such_directive") || !strings.Contains(err.Error(), "Caddyfile:8") {
		t.Errorf("Load error does not name the directive and line: %v", err)
	}
	if code, body := get(t, inst.URL("/")); code != 200 || body != "uno" {
		t.Fatalf("after a refused Load: got %d %q, want the old config's 200 \"uno\"", code, body)
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

// TestStartJSON runs a JSON config with the same placeholders.
func TestStartJSON(t *testing.T) {
	inst := StartJSON(t, `{
  "admin": {"listen": "{{admin}}"},
  "apps": {"http": {"servers": {"s": {
    "listen": ["{{http}}"],
    "automatic_https": {"disable": true},
    "routes": [{"handle": [{"handler": "static_response", "body": "json"}]}]
  }}}}
}`)
	if code, body := get(t, inst.URL("/")); code != 200 || body != "json" {
		t.Fatalf("got %d %q, want 200 \"json\"", code, body)
	}
}

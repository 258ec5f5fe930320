package ratelimit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	// log_append, and the file writer and JSON encoder of the access log.
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/logging"
	_ "github.com/caddyserver/caddy/v2/modules/logging"
)

// TestExceededPassRoutes runs Caddy in this process with a Caddyfile that
// routes on {http.rate_limit.exceeded.name} with the vars matcher, as an
// operator writes it, and logs it with log_append: a key under its token
// quota reaches the "large" route; a key that spent it is passed on to
// the "small" route, with the rate-limit fields and no Retry-After, and
// its access log line names the zone; no rate_limit_exceeded event is
// emitted for it. Once the requests zone refuses, the refusal is a 429
// that emits the event, as without the option.
func TestExceededPassRoutes(t *testing.T) {
	adminPort, httpPort := loopbackPorts(t)
	logFile := filepath.Join(t.TempDir(), "access.log")
	site := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
}

http://127.0.0.1:%d {
	log {
		output file %s
		format json
	}
	log_append exceeded {http.rate_limit.exceeded.name}
	rate_limit {
		zone xp_route_tokens {
			key header X-API-Key
			rate 2/1h
			exceeded pass
		}
		zone xp_route_requests {
			key header X-API-Key
			rate 5/1h
		}
	}
	@spent vars {http.rate_limit.exceeded.name} xp_route_tokens
	handle @spent {
		respond "small"
	}
	handle {
		respond "large"
	}
}
`, adminPort, httpPort, logFile)
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, warnings, err := adapter.Adapt([]byte(site), nil)
	if err != nil {
		t.Fatalf("adapt: %v (warnings %v)", err, warnings)
	}
	// The events app, which a Caddyfile cannot subscribe a module to.
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events": []string{"rate_limit_exceeded"}, "handlers": []any{map[string]any{"handler": "floodgate_test_recorder"}},
	}}}
	if out, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	for len(recordedEvents) > 0 {
		<-recordedEvents
	}
	c := loadCaddy(t, out)

	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat", httpPort)
	get := func(key string) (int, http.Header, string) {
		t.Helper()
		return getWith(t, c, url, "X-API-Key", key)
	}
	noEvent := func(what string) {
		t.Helper()
		select {
		case e := <-recordedEvents:
			t.Errorf("%s emitted %s %v", what, e.Name(), e.Data)
		default:
		}
	}

	for i := range 2 {
		if code, _, body := get("k1"); code != 200 || body != "large" {
			t.Fatalf("request %d under the quota: %d %q, want 200 large", i+1, code, body)
		}
	}
	for i := range 3 {
		code, hdr, body := get("k1")
		if code != 200 || body != "small" {
			t.Fatalf("request %d over the quota: %d %q, want 200 small", i+3, code, body)
		}
		if hdr.Get("X-RateLimit-Remaining") != "0" || hdr.Get("X-RateLimit-Limit") != "2" || hdr.Get("Retry-After") != "" {
			t.Errorf("request %d: X-RateLimit-Limit %q, -Remaining %q, Retry-After %q; want 2, 0 and none",
				i+3, hdr.Get("X-RateLimit-Limit"), hdr.Get("X-RateLimit-Remaining"), hdr.Get("Retry-After"))
		}
		if want := fmt.Sprintf(`"xp_route_requests";r=%d;`, 2-i); !strings.Contains(hdr.Get("RateLimit"), want) {
			t.Errorf("request %d: RateLimit %q, want %s: the requests zone counts it", i+3, hdr.Get("RateLimit"), want)
		}
		noEvent(fmt.Sprintf("request %d, passed on,", i+3))
	}
	if code, _, body := get("k2"); code != 200 || body != "large" {
		t.Errorf("another key: %d %q, want 200 large", code, body)
	}
	if code, hdr, _ := get("k1"); code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Errorf("request 6, over the requests zone: %d, Retry-After %q; want 429 with it", code, hdr.Get("Retry-After"))
	}
	select {
	case e := <-recordedEvents:
		if e.Data["zone"] != "xp_route_requests" {
			t.Errorf("the refusal's event names zone %v, want xp_route_requests", e.Data["zone"])
		}
	case <-time.After(5 * time.Second):
		t.Error("the refusal emitted no event")
	}

	// The access log: one line per request, in order, each naming the
	// zone over its limit or none.
	want := []any{nil, nil, "xp_route_tokens", "xp_route_tokens", "xp_route_tokens", nil, "xp_route_requests"}
	var got []any
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		got = accessLogField(t, logFile, "exceeded")
		if len(got) < len(want) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the access log's exceeded fields %v, want %v", got, want)
	}
}

// accessLogField is field of every line of the JSON access log at path.
func accessLogField(t *testing.T, path, field string) []any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vals []any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("access log line %q: %v", sc.Text(), err)
		}
		vals = append(vals, line[field])
	}
	return vals
}

package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// recordedEvents receives the events the test recorder hears.
var recordedEvents = make(chan caddy.Event, 16)

// eventRecorder is an events handler module for TestEventEmitted: a
// subscriber that hands what it hears to the test.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.floodgate_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	select {
	case recordedEvents <- e:
	default:
	}
	return nil
}

// TestEventEmitted runs Caddy in this process with a subscriber to
// rate_limit_exceeded, and checks that a refusal emits it with the zone,
// the wait and the client's IP, as mholt/caddy-ratelimit does, and that an
// admitted request emits nothing.
func TestEventEmitted(t *testing.T) {
	adminPort, httpPort := loopbackPorts(t)
	cfg := fmt.Sprintf(`{
	"admin": {"listen": "127.0.0.1:%d", "config": {"persist": false}},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {
		"events": {"subscriptions": [{"events": ["rate_limit_exceeded"], "handlers": [{"handler": "floodgate_test_recorder"}]}]},
		"http": {"servers": {"s": {
			"listen": ["127.0.0.1:%d"],
			"automatic_https": {"disable": true},
			"routes": [{"handle": [
				{"handler": "rate_limit", "rate_limits": {"evented": {"key": "{http.request.header.X-Client}", "max_events": 1, "window": "1h"}}},
				{"handler": "static_response", "body": "ok"}
			]}]
		}}}
	}
}`, adminPort, httpPort)
	c := loadCaddy(t, []byte(cfg))
	url := fmt.Sprintf("http://127.0.0.1:%d/", httpPort)
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code, _, _ := getWith(t, c, url, "X-Client", "k"); code != want {
			t.Fatalf("GET %s: status %d, want %d", url, code, want)
		}
	}
	select {
	case e := <-recordedEvents:
		if e.Name() != "rate_limit_exceeded" {
			t.Fatalf("event %q", e.Name())
		}
		if e.Data["zone"] != "evented" || e.Data["remote_ip"] != "127.0.0.1" {
			t.Errorf("event data %v, want zone evented and remote_ip 127.0.0.1", e.Data)
		}
		if wait, ok := e.Data["wait"].(time.Duration); !ok || wait <= 0 || wait > time.Hour {
			t.Errorf("event wait %v, want a positive duration up to the window", e.Data["wait"])
		}
	case <-time.After(testutil.WaitLimit):
		t.Fatal("no rate_limit_exceeded event for a refusal")
	}
	select {
	case e := <-recordedEvents:
		t.Errorf("a second event %v for one refusal", e)
	default:
	}
}

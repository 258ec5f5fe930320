package ratelimit

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestCLISeconds: windows and waits read as Go durations without trailing
// zero units.
func TestCLISeconds(t *testing.T) {
	for s, want := range map[float64]string{
		0: "0s", 0.5: "500ms", 30: "30s", 60: "1m", 90: "1m30s",
		3600: "1h", 5400: "1h30m", 3601: "1h0m1s", 86400: "24h", 3599.9834: "59m59.983s",
	} {
		if got := seconds(s); got != want {
			t.Errorf("seconds(%v) = %q, want %q", s, got, want)
		}
	}
}

// TestCLIAnswers: the CLI reads an error answer of the admin API as Caddy
// writes it (a caddy.APIError as JSON) and shows its message and status;
// another body is shown as it is; a success is returned whole. It asks over
// TCP, naming the origin the admin endpoint checks, and over a unix socket
// given with permission bits.
func TestCLIAnswers(t *testing.T) {
	mux := http.NewServeMux()
	var origins []string
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		origins = append(origins, r.Header.Get("Origin"))
		switch r.URL.Path {
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(caddy.APIError{HTTPStatus: http.StatusNotFound, Message: `no zone "x" in the running config`})
		case "/proxy":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "bad gateway\n")
		default:
			_, _ = io.WriteString(w, `{"ok":true}`)
		}
	})
	tcp := httptest.NewServer(mux)
	defer tcp.Close()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	unix := httptest.NewUnstartedServer(mux)
	unix.Listener = ln
	unix.Start()
	defer unix.Close()

	tcpAddr := strings.TrimPrefix(tcp.URL, "http://")
	for _, addr := range []string{tcpAddr, "unix/" + sock + "|0220"} {
		api := &adminClient{addr: addr}
		_, err := api.call(http.MethodGet, "/missing")
		if err == nil || err.Error() != `no zone "x" in the running config (HTTP 404)` {
			t.Errorf("%s: API error: %v", addr, err)
		}
		_, err = api.call(http.MethodGet, "/proxy")
		if err == nil || err.Error() != "the admin API answered HTTP 502: bad gateway" {
			t.Errorf("%s: other error: %v", addr, err)
		}
		body, err := api.call(http.MethodGet, "/zones")
		if err != nil || string(body) != `{"ok":true}` {
			t.Errorf("%s: answer %q, %v", addr, body, err)
		}
	}
	want := []string{"http://" + tcpAddr, "http://" + tcpAddr, "http://" + tcpAddr, "", "", ""}
	if !slices.Equal(origins, want) {
		t.Errorf("origins %q, want %q", origins, want)
	}
	if _, err := (&adminClient{addr: "localhost:1-2"}).call(http.MethodGet, "/"); err == nil {
		t.Error("a port range was taken for an admin address")
	}
}

// TestCLIOverrideSetBody: `override set` writes its limit as the API reads
// it: <n>/<duration> as a tier's rate (a bare unit meaning one of it),
// <n>/day|week|month as a calendar period, a bare <n> leaving the window
// to the zone; --burst only when given (0 included, for the API to
// refuse), --expires as typed; and refuses what no limit can be.
func TestCLIOverrideSetBody(t *testing.T) {
	for _, c := range []struct {
		rate  string
		flags []string
		want  string
	}{
		{"1000/1h", nil, `{"limit":1000,"window":"1h0m0s"}`},
		{"5/s", nil, `{"limit":5,"window":"1s"}`},
		{"10000/d", nil, `{"limit":10000,"window":"24h0m0s"}`},
		{"100/month", nil, `{"limit":100,"window":"month"}`},
		{"7", nil, `{"limit":7}`},
		{"6/30m", []string{"--burst", "2", "--expires", "90m"}, `{"limit":6,"window":"30m0s","burst":2,"expires":"90m"}`},
		{"6/30m", []string{"--burst", "0"}, `{"limit":6,"window":"30m0s","burst":0}`},
		{"6", []string{"--expires", "2026-12-01T00:00:00Z"}, `{"limit":6,"expires":"2026-12-01T00:00:00Z"}`},
	} {
		cmd := withOverrideSet(cliCommand("set", "", "", 3, cliOverrideSet))
		if err := cmd.Flags().Parse(c.flags); err != nil {
			t.Fatal(err)
		}
		body, err := overrideSetBody(c.rate, caddycmd.Flags{FlagSet: cmd.Flags()})
		if err != nil || string(body) != c.want {
			t.Errorf("set %s %v: %s, %v; want %s", c.rate, c.flags, body, err, c.want)
		}
	}
	for _, rate := range []string{"0", "-3", "0/1h", "ten", "5/fortnight", "5/0s", ""} {
		cmd := withOverrideSet(cliCommand("set", "", "", 3, cliOverrideSet))
		if body, err := overrideSetBody(rate, caddycmd.Flags{FlagSet: cmd.Flags()}); err == nil {
			t.Errorf("set %q: %s, want a refusal", rate, body)
		}
	}
}

// TestCLITableEscapesKeys: a client's key, printed in a table, never
// reaches the operator's terminal as control characters: an escape
// sequence, a newline or a tab is shown escaped, so it can neither retitle
// or clear the terminal nor forge a row. (`caddy rate-limit top` printed
// keys raw: a key from a query parameter set the terminal's title, cleared
// the screen and added a forged row.)
func TestCLITableEscapesKeys(t *testing.T) {
	hostile := "x\x1b]0;owned\x07\x1b[2J\nrl_forged\t203.0.113.1\t999999\t0"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(zoneTop{Zone: "api", Keys: []hotKey{{Key: hostile, Requests: 3, Denied: 1}}})
	}))
	defer srv.Close()
	api := &adminClient{addr: strings.TrimPrefix(srv.URL, "http://")}
	var out bytes.Buffer
	cmd := withTop(cliCommand("top", "", "", 1, cliTop))
	if err := cliTop(api, caddycmd.Flags{FlagSet: cmd.Flags()}, []string{"api"}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.ContainsAny(got, "\x1b\x07\t") || strings.Count(got, "\n") != 2 {
		t.Fatalf("top printed control characters or an extra row:\n%q", got)
	}
	if !strings.Contains(got, `x\x1b]0;owned\a\x1b[2J\nrl_forged\t203.0.113.1`) {
		t.Fatalf("top did not show the key escaped:\n%q", got)
	}
}

// TestCLIInspectShowsOverride: `caddy rate-limit inspect` of an exempt
// key says so in its OVERRIDE column, run against the real admin routes.
// (The bug it guards against: the table dropped the API's override member and printed
// LIMIT 0, REMAINING 0: the row of a spent key, the opposite of what the
// key's requests see.)
func TestCLIInspectShowsOverride(t *testing.T) {
	const name, ip = "ov_cli_ex", "198.51.100.201"
	h := provisionHandler(t, rateLimitConfig(zoneConfig(name, "key ip", "rate 10/1m")))
	setOverride(t, h, name, ip, limiter.Override{Action: limiter.OverrideExempt})
	api := cliAgainstAdmin(t)
	cmd := withTier(cliCommand("inspect", "", "", 2, cliInspect))
	var out bytes.Buffer
	if err := cliInspect(api, caddycmd.Flags{FlagSet: cmd.Flags()}, []string{name, ip}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	if !strings.Contains(out.String(), "exempt") {
		t.Fatalf("caddy rate-limit inspect of an exempt key prints no sign of the exemption:\n%s", out.String())
	}
}

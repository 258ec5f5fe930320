package ratelimit

import (
	"errors"
	"testing"
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

// TestCLIAPIMessage: an error answer of the admin API is shown by its
// message and status; other errors are not taken for one.
func TestCLIAPIMessage(t *testing.T) {
	msg, ok := apiMessage(errors.New(`caddy responded with error: HTTP 404: {"error":"no zone \"x\" in the running config"}` + "\n"))
	if !ok || msg.Error() != `no zone "x" in the running config (HTTP 404)` {
		t.Errorf("API error: %v, %v", msg, ok)
	}
	for _, text := range []string{
		`performing request: dial tcp 127.0.0.1:1: connect: connection refused`,
		`caddy responded with error: HTTP 502: {"status":"bad gateway"}`,
		`caddy responded with error: HTTP 500: {not json`,
	} {
		if msg, ok := apiMessage(errors.New(text)); ok {
			t.Errorf("%q taken for an API error: %v", text, msg)
		}
	}
}

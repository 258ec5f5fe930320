package ratelimit

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestRefusalMatchesCaddyError pins refusal's copy of caddyhttp.Error: for
// speed it makes the ID and Trace itself, so a Caddy upgrade that changes
// the ID's length or alphabet, or the Trace's format, fails here instead of
// changing refusals' logs unseen.
func TestRefusalMatchesCaddyError(t *testing.T) {
	cause := errors.New("refused")
	theirs, function, file, line := caddyErrorHere(cause)
	if want := formatTrace(function, file, line); theirs.Trace != want {
		t.Errorf("caddyhttp.Error's trace %q, formatTrace makes %q", theirs.Trace, want)
	}

	ours, ok := refusal(cause).(caddyhttp.HandlerError)
	if !ok {
		t.Fatalf("refusal is %T, want caddyhttp.HandlerError", refusal(cause))
	}
	if ours.StatusCode != http.StatusTooManyRequests || !errors.Is(ours, cause) {
		t.Errorf("refusal: status %d, error %v", ours.StatusCode, ours.Err)
	}
	if want := "caddy-ratelimit.(*Handler).deny (respond.go:"; !strings.HasPrefix(ours.Trace, want) {
		t.Errorf("refusal's trace %q, want it to start %q", ours.Trace, want)
	}

	// 3,000 IDs of 9 characters each use every one of 32 characters but
	// with a chance below 1e-50.
	alphabet := func(what string, id func() string) map[rune]bool {
		seen := map[rune]bool{}
		for range 3000 {
			s := id()
			if len(s) != len(theirs.ID) {
				t.Fatalf("%s ID %q has %d characters, caddyhttp.Error's %d", what, s, len(s), len(theirs.ID))
			}
			for _, c := range s {
				seen[c] = true
			}
		}
		return seen
	}
	caddyChars := alphabet("caddyhttp.Error's", func() string { return caddyhttp.Error(http.StatusTooManyRequests, cause).ID })
	ourChars := alphabet("refusal's", newErrorID)
	for c := range caddyChars {
		if !ourChars[c] {
			t.Errorf("caddyhttp.Error's IDs use %q, refusal's never do", c)
		}
	}
	for c := range ourChars {
		if !caddyChars[c] {
			t.Errorf("refusal's IDs use %q, caddyhttp.Error's never do", c)
		}
	}
}

// caddyErrorHere calls caddyhttp.Error and reports the call's location,
// which Caddy's Trace names.
func caddyErrorHere(cause error) (err caddyhttp.HandlerError, function, file string, line int) {
	err, here := caddyhttp.Error(http.StatusTooManyRequests, cause), callSite()
	return err, here.Function, here.File, here.Line
}

// callSite is the frame of the call to it.
func callSite() runtime.Frame {
	pc := make([]uintptr, 1)
	runtime.Callers(2, pc)
	f, _ := runtime.CallersFrames(pc).Next()
	return f
}

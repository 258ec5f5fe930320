package e2e

// Tests of the harness itself (harness_test.go): its structured-field
// parsers, which read RateLimit and RateLimit-Policy as RFC 9651 lists
// and draft 7's RateLimit as a Dictionary,
// and send's retry of a connection a reload dropped.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestSFParser checks the test's own parser against RFC 9651 examples, so
// a failure above is the handler's and not the parser's.
func TestSFParser(t *testing.T) {
	t.Parallel()
	items, err := parseSFList(`"a\"b\\c";q=20;w=12, tok;qu="concurrent-requests";x, "z";r=-3;d=1.5;b=?0`)
	if err != nil {
		t.Fatal(err)
	}
	want := []sfItem{
		{`a"b\c`, []sfParam{{"q", int64(20)}, {"w", int64(12)}}},
		{"tok", []sfParam{{"qu", "concurrent-requests"}, {"x", true}}},
		{"z", []sfParam{{"r", int64(-3)}, {"d", 1.5}, {"b", false}}},
	}
	if fmt.Sprint(items) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", items, want)
	}
	for _, bad := range []string{`"a`, `"a\x"`, `"a";Q=1`, `"a",`, `"a" "b"`, `"a";q=1.2345`, `"a";q=1234567890123456`, "\"\x01\""} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}

// TestSFDictionaryParser checks the Dictionary parser the same way.
func TestSFDictionaryParser(t *testing.T) {
	t.Parallel()
	members, err := parseSFDictionary(`limit=100, remaining=50,reset=30;x, flag;p=1, s="v"`)
	if err != nil {
		t.Fatal(err)
	}
	want := []sfMember{
		{"limit", sfItem{int64(100), nil}},
		{"remaining", sfItem{int64(50), nil}},
		{"reset", sfItem{int64(30), []sfParam{{"x", true}}}},
		{"flag", sfItem{true, []sfParam{{"p", int64(1)}}}},
		{"s", sfItem{"v", nil}},
	}
	if fmt.Sprint(members) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", members, want)
	}
	for _, bad := range []string{`limit=1, limit=2`, `Limit=1`, `limit=1,`, `limit=1 remaining=2`, `limit=`, `"limit"=1`, `100;w=60`} {
		if _, err := parseSFDictionary(bad); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}

// TestSendRetriesDroppedConnection: send retries a GET whose connection
// was closed before any response once, as a reload does to a connection
// queued on the old socket, but a server that drops every connection still
// fails it, and a request that is not idempotent is never sent twice.
func TestSendRetriesDroppedConnection(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var dropAll atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 || dropAll.Load() {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	c := newClient(t)

	r, err := send(c, http.MethodGet, srv.URL)
	if err != nil || r.body != "ok" || calls.Load() != 2 {
		t.Fatalf("dropped once: %v %q after %d attempts, want ok after 2", err, r.body, calls.Load())
	}
	calls.Store(1)
	if _, err := send(c, http.MethodPost, srv.URL); err != nil {
		t.Fatalf("POST: %v", err)
	}
	calls.Store(0)
	if _, err := send(c, http.MethodPost, srv.URL); err == nil || calls.Load() != 1 {
		t.Fatalf("a dropped POST: err %v after %d attempts, want an error after 1", err, calls.Load())
	}
	dropAll.Store(true)
	calls.Store(0)
	if _, err := send(c, http.MethodGet, srv.URL); err == nil || calls.Load() != 2 {
		t.Fatalf("a server dropping every connection: err %v after %d attempts, want an error after 2", err, calls.Load())
	}
}

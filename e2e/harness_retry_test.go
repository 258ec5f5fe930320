package e2e

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

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

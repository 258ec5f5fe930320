package e2e

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestRedisConcurrencyHoldsSlotWhileRequestRuns: a Redis concurrency slot
// is held for as long as its request runs, past the zone's window, as in
// the memory store. Before slots were renewed, a request sent 1.5s after
// the first, while the first still ran, got 200 and the upstream saw two
// in flight.
func TestRedisConcurrencyHoldsSlotWhileRequestRuns(t *testing.T) {
	up := newUpstream(t, 0)
	up.hold()
	_, inst := startRedisSite(t, "1s", redisRoute{
		path:     "/cc",
		zone:     "key global\nalgorithm concurrency\nevents 1\nwindow 1s\nfail closed",
		upstream: up.url,
	})
	c := newClient(t)
	url := inst.URL("/cc")
	var first response
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { first, firstErr = send(c, http.MethodGet, url) })
	up.waitArrivals(t, 1)
	time.Sleep(1500 * time.Millisecond) // past the window, the first still running
	// A request admitted now would wait on the gated upstream: a short
	// timeout tells that apart from a refusal quickly.
	quick := *newClient(t)
	quick.Timeout = 5 * time.Second
	later := func() int {
		r, err := send(&quick, http.MethodGet, url)
		if err != nil {
			t.Logf("a request while the first still ran was admitted and held: %v", err)
			return 200
		}
		return r.code
	}
	second := later()
	time.Sleep(1500 * time.Millisecond)
	third := later()
	up.open()
	wg.Wait()
	if firstErr != nil || first.code != 200 {
		t.Fatalf("first request: %d, %v", first.code, firstErr)
	}
	if second != 429 || third != 429 {
		t.Errorf("requests while the first still ran: %d and %d, want 429", second, third)
	}
	if p := up.peak.Load(); p != 1 {
		t.Errorf("upstream saw %d requests at once, want 1", p)
	}
	if after := get(t, c, url); after.code != 200 {
		t.Errorf("after the first finished: %d, want 200", after.code)
	}
}

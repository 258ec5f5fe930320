package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// rendezvous lets the decisions of one request through once n of them
// have arrived, or each after a timeout: missed counts those that waited
// it out. Between requests, next readies it for the next one.
type rendezvous struct {
	n       int32
	arrived atomic.Int32
	all     chan struct{}
	missed  atomic.Int32
	total   int32
}

func newRendezvous(n int32) *rendezvous { return &rendezvous{n: n, all: make(chan struct{})} }

func (rv *rendezvous) next() {
	rv.total += rv.arrived.Swap(0)
	rv.all = make(chan struct{})
}

// check fails unless total decisions arrived and each found the rest of
// its request's under way, none waiting the timeout out.
func (rv *rendezvous) check(t *testing.T, total int32) {
	t.Helper()
	if rv.total != total || rv.missed.Load() != 0 {
		t.Fatalf("%d decisions, want %d; %d asked alone: the zones were decided one after the other", rv.total, total, rv.missed.Load())
	}
}

func (rv *rendezvous) wait() {
	if rv.arrived.Add(1) == rv.n {
		close(rv.all)
		return
	}
	select {
	case <-rv.all:
	case <-time.After(2 * time.Second):
		rv.missed.Add(1)
	}
}

// remoteStore stands in for a Redis store: a memory store whose decisions
// wait at a rendezvous, counting what it is asked.
type remoteStore struct {
	limiter.Store
	rv              *rendezvous
	takes, gaveBack atomic.Int32
}

// Take answers as the memory store does, with an admission that gives
// back through s, so give-backs are counted.
func (s *remoteStore) Take(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	s.takes.Add(1)
	s.rv.wait()
	a, err := s.Store.Take(ctx, key, cost)
	if err != nil || !a.Allowed {
		return a, err
	}
	return limiter.NewAdmission(s, key, cost, a.Decision, a.Receipt), nil
}

func (s *remoteStore) GiveBack(ctx context.Context, key string, units int64, taken limiter.Receipt) (limiter.Decision, error) {
	s.gaveBack.Add(1)
	return s.Store.GiveBack(ctx, key, units, taken)
}

// remoteZones provisions fixed-window zones of the given limits per hour,
// named in order, and makes each a remoteStore meeting at rv.
func remoteZones(t *testing.T, rv *rendezvous, prefix string, limits ...int) (*Handler, []*remoteStore) {
	t.Helper()
	var b strings.Builder
	b.WriteString("rate_limit {\n")
	for i, n := range limits {
		fmt.Fprintf(&b, " zone %s_%c {\n  key ip\n  algorithm fixed_window\n  rate %d/1h\n }\n", prefix, 'a'+i, n)
	}
	b.WriteString("}")
	h := provisionHandler(t, b.String())
	stores := make([]*remoteStore, len(h.zones))
	for i, z := range h.zones {
		stores[i] = &remoteStore{Store: z.limit.store, rv: rv}
		z.limit.store, z.limit.remote = stores[i], true
	}
	h.remoteZones = len(h.zones)
	return h, stores
}

// TestRemoteZonesDecidedTogether: a request matching two remote zones asks
// both stores at once, and the outcome is what deciding them in name order
// gives, whichever refuses.
func TestRemoteZonesDecidedTogether(t *testing.T) {
	t.Run("later zone refuses", func(t *testing.T) {
		rv := newRendezvous(2) // two zones per request
		h, stores := remoteZones(t, rv, "later", 100, 2)
		serveAll(t, h, "198.51.100.50", []int{200, 200, 429, 429}, rv.next)
		rv.check(t, 8)
		// The first zone gave back what the two refused requests took.
		if got := stores[0].gaveBack.Load(); got != 2 {
			t.Fatalf("first zone gave back %d, want 2", got)
		}
		r, _ := newKeyRequest("198.51.100.50", nil)
		w, _ := serve(h, r, okHandler)
		if got := w.Header().Get("RateLimit"); !strings.Contains(got, `"later_a";r=98;`) {
			t.Fatalf("RateLimit %q, want later_a at 98: only the two admitted requests spent", got)
		}
	})
	t.Run("earlier zone refuses", func(t *testing.T) {
		rv := newRendezvous(2)
		h, stores := remoteZones(t, rv, "earlier", 2, 100)
		serveAll(t, h, "198.51.100.51", []int{200, 200, 429, 429}, rv.next)
		rv.check(t, 8)
		// The second zone was asked ahead of its turn on the refused
		// requests too, and gave both back: it reports nothing for them.
		if got := stores[1].gaveBack.Load(); got != 2 {
			t.Fatalf("second zone gave back %d, want 2", got)
		}
		d, err := stores[1].Store.Take(context.Background(), "198.51.100.51", 1)
		if err != nil || d.Remaining != 97 {
			t.Fatalf("second zone after 2 admitted and 2 refused: remaining %d (%v), want 97", d.Remaining, err)
		}
	})
}

// BenchmarkRedisThreeZones is one request matching three Redis zones on a
// redis-server, its zones decided together (as served) and, for
// comparison, one after another. Tests in this package start no process,
// so the server is one the caller runs, named by REDIS_ADDR (host:port);
// without it the benchmark is skipped:
//
//	redis-server --port 6390 --save '' &
//	REDIS_ADDR=127.0.0.1:6390 go test -run '^$' -bench RedisThreeZones .
//
// It flushes nothing, and its keys expire within a second of its end.
func BenchmarkRedisThreeZones(b *testing.B) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		b.Skip("REDIS_ADDR is not set: start a redis-server and name it there (see the benchmark's comment)")
	}
	var zones strings.Builder
	for _, name := range []string{"bench3_a", "bench3_b", "bench3_c"} {
		fmt.Fprintf(&zones, " zone %s {\n  store redis\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n", name)
	}
	h := provisionHandler(b, "rate_limit {\n redis {\n  url redis://"+addr+"\n  timeout 2s\n }\n"+zones.String()+"}")
	r, _ := newKeyRequest("198.51.100.53", nil)
	w := httptest.NewRecorder()
	for _, bc := range []struct {
		name        string
		remoteZones int
	}{{"together", h.remoteZones}, {"one after another", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			h.remoteZones = bc.remoteZones
			for b.Loop() {
				clear(w.Header())
				if err := h.ServeHTTP(w, r, okHandler); err != nil || w.Header().Get("RateLimit") == "" {
					b.Fatalf("not decided by the zones: %v, %v", err, w.Header())
				}
			}
		})
	}
}

// TestZonesAfterRefusalCountNoDecision: docs/reference.md ("Several zones"): zones after the
// refusing one are not decided (their keys and costs are read, nothing is
// taken); design.md: metrics are those of deciding one zone after
// another. A zone after the refusal whose key is exempt, or whose dry_run
// cost is invalid, must then count no decision for the refused request:
// it counts one allowed (exempt) or dry_run_denied (invalid cost), and an
// override decision, for a request it never decided.
func TestZonesAfterRefusalCountNoDecision(t *testing.T) {
	h := provisionHandler(t, `rate_limit {
		zone a_ru_mx_first {
			key ip
			rate 1/1h
		}
		zone b_ru_mx_exempt {
			key ip
			rate 10/1h
		}
		zone c_ru_mx_dry {
			key ip
			rate 10/1h
			cost {http.request.header.X-Cost}
			dry_run
		}
	}`)
	const ip = "198.51.100.190"
	setOverride(t, h, "b_ru_mx_exempt", ip, limiter.Override{Action: limiter.OverrideExempt})
	b, c := handlerZone(t, h, "b_ru_mx_exempt"), handlerZone(t, h, "c_ru_mx_dry")
	r, _ := newKeyRequest(ip, map[string]string{"X-Cost": "bad"})
	if _, code := serve(h, r, okHandler); code != 200 {
		t.Fatalf("first: %d", code)
	}
	allowed, exempt, dry := counterValue(t, b.metrics.allowed), counterValue(t, b.metrics.overridden[limiter.OverrideExempt-1]), counterValue(t, c.metrics.dryRunDenied)
	r, _ = newKeyRequest(ip, map[string]string{"X-Cost": "bad"})
	if _, code := serve(h, r, okHandler); code != http.StatusTooManyRequests {
		t.Fatalf("second: %d, want 429 from a", code)
	}
	if got := counterValue(t, b.metrics.allowed) - allowed; got != 0 {
		t.Errorf("b (exempt, after the refusal) counted %v allowed decisions for the refused request, want 0", got)
	}
	if got := counterValue(t, b.metrics.overridden[limiter.OverrideExempt-1]) - exempt; got != 0 {
		t.Errorf("b counted %v exempt override decisions for the refused request, want 0", got)
	}
	if got := counterValue(t, c.metrics.dryRunDenied) - dry; got != 0 {
		t.Errorf("c (dry_run, invalid cost, after the refusal) counted %v dry_run_denied for the refused request, want 0", got)
	}
}

package ratelimit

import (
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestReclaimsReachOtherHandlersOfTheProcess: two handlers of one process
// (two sites) declare one leased Redis zone, each with its own near cache
// over the one pooled Reclaims. When Redis refuses a key to handler B
// while handler A holds lease units of it, B's request for them reaches
// A, and B then admits the whole limit well before A's leases lapse.
func TestReclaimsReachOtherHandlersOfTheProcess(t *testing.T) {
	srv := redistest.Start(t)
	cfg := rateLimitConfig(zoneConfig("reclaim_sites", "key ip", "algorithm fixed_window", "rate 30/1h",
		"store redis", "local_quota 0.3"), redisConfig(srv.Addr(), "timeout 1s"))
	a, b := provisionHandler(t, cfg), provisionHandler(t, cfg)
	admitted := 0
	for range 8 {
		if serveIP(a, "192.0.2.1") == 200 {
			admitted++
		}
	}
	if admitted != 8 {
		t.Fatalf("handler A admitted %d of 8", admitted)
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	for admitted < 30 && time.Now().Before(deadline) {
		if serveIP(b, "192.0.2.1") == 200 {
			admitted++
		}
		time.Sleep(10 * time.Millisecond)
	}
	if admitted != 30 {
		t.Fatalf("%d admitted within 500 ms of handler B's first request, want 30", admitted)
	}
	for range 5 {
		if serveIP(a, "192.0.2.1") == 200 || serveIP(b, "192.0.2.1") == 200 {
			t.Fatal("admitted more than 30")
		}
	}
	asked := counterValue(t, metricFamilies.reclaims.WithLabelValues("reclaim_sites", "asked"))
	heard := counterValue(t, metricFamilies.reclaims.WithLabelValues("reclaim_sites", "heard"))
	if asked < 1 || heard < 1 {
		t.Fatalf("lease_reclaims_total: asked %v, heard %v; want both counted", asked, heard)
	}
}

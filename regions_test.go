package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestRegionsShareOneLimit: two handlers, each in a region of its own
// (its own Redis) with one global Redis, admit the zone's limit between
// them, no more; the region that spent global's units counts its refills
// and the units it took; the admin API shows the key's units in the
// region and its count in global, and names the global server; and each
// handler still decides after its Cleanup.
func TestRegionsShareOneLimit(t *testing.T) {
	global := redistest.Start(t)
	regions := [2]*redistest.Server{redistest.Start(t), redistest.Start(t)}
	const zone = "regions_share"
	config := func(region *redistest.Server, extra ...string) string {
		return rateLimitConfig(
			zoneConfig(zone, append([]string{"events 20", "window 1m", "algorithm fixed_window", "store redis"}, extra...)...),
			configBlock("redis", "url redis://"+region.Addr(), "timeout 1s", configBlock("global", "url redis://"+global.Addr(), "region_quota 0.25")),
		)
	}
	a := provisionHandler(t, config(regions[0]))
	b := provisionHandler(t, config(regions[1], "local_quota 0.1"))
	if b.reclaims != nil {
		t.Error("a regional zone with local_quota subscribed to lease reclaims: zone.go (keyName) says why it must not")
	}

	admitted := 0
	for range 30 {
		if serveIP(a, "192.0.2.1") == http.StatusOK {
			admitted++
		}
	}
	for range 30 {
		if serveIP(b, "192.0.2.1") == http.StatusOK {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("the two regions admitted %d of 60 requests, want the limit, 20 (region a alone spends every unit, batches up to 5)", admitted)
	}
	refills := counterValue(t, metricFamilies.globalRefills.WithLabelValues(zone))
	taken := counterValue(t, metricFamilies.globalUnits.WithLabelValues(zone, "taken"))
	if refills < 4 || taken != 20 {
		t.Errorf("refills %v and units taken %v from global, want at least 4 batches of at most 5, 20 units", refills, taken)
	}

	// Inspect in region a: its batch is spent, global has nothing left.
	r := httptest.NewRequest(http.MethodGet, adminPrefix+"zones/"+zone+"?key=192.0.2.1", nil)
	w := httptest.NewRecorder()
	if err := serveAdmin(w, r); err != nil {
		t.Fatal(err)
	}
	var reports []keyReport
	if err := json.Unmarshal(w.Body.Bytes(), &reports); err != nil {
		t.Fatalf("inspect answered %s: %v", w.Body, err)
	}
	if len(reports) != 2 {
		t.Fatalf("inspect answered %d zones, want both handlers': %s", len(reports), w.Body)
	}
	for _, rep := range reports {
		if rep.Region == nil {
			t.Fatalf("inspect shows no region: %s", w.Body)
		}
		if rep.Region.GlobalRemaining != 0 || rep.Region.Units != 0 || rep.Remaining != 0 {
			t.Errorf("inspect %+v %+v: want nothing left in global or the region", rep, *rep.Region)
		}
	}

	found := false
	for _, info := range listZones() {
		if info.Zone == zone {
			found = true
			if info.Global != "redis://"+global.Addr() || info.RegionQuota != 0.25 {
				t.Errorf("zones API lists global %q, region_quota %v; want redis://%s, 0.25", info.Global, info.RegionQuota, global.Addr())
			}
		}
	}
	if !found {
		t.Errorf("zones API does not list %s", zone)
	}

	// After Cleanup (a reload), the handler still decides.
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if code := serveIP(b, "192.0.2.1"); code != http.StatusTooManyRequests {
		t.Errorf("after Cleanup the handler answered %d, want 429", code)
	}
	if code := serveIP(b, "192.0.2.2"); code != http.StatusOK {
		t.Errorf("after Cleanup the handler answered %d for a fresh key, want 200", code)
	}
}

// TestRegionsShareAnOverride: an override set in both regions (this
// process's admin API writes it into each region's Redis, as an operator
// sets it through an instance of each) is one limit across them, as the
// zone's own is (docs/regions.md, "Runtime overrides"): each region's
// write draws its own Gen, and a state named by it would be a count of
// its own in global, each region admitting the whole override limit.
func TestRegionsShareAnOverride(t *testing.T) {
	global := redistest.Start(t)
	regions := [2]*redistest.Server{redistest.Start(t), redistest.Start(t)}
	const zone = "regions_override"
	config := func(region *redistest.Server) string {
		return rateLimitConfig(
			zoneConfig(zone, "events 20", "window 1m", "algorithm fixed_window", "store redis"),
			configBlock("redis", "url redis://"+region.Addr(), "timeout 1s", configBlock("global", "url redis://"+global.Addr(), "region_quota 0.5")),
		)
	}
	a := provisionHandler(t, config(regions[0]))
	b := provisionHandler(t, config(regions[1]))
	if code, body := pxAdmin(t, http.MethodPut, zone, "key=192.0.2.1", `{"limit": 6}`); code != http.StatusOK {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	admitted := 0
	for range 10 {
		for _, h := range []*Handler{a, b} {
			if serveIP(h, "192.0.2.1") == http.StatusOK {
				admitted++
			}
		}
	}
	if admitted != 6 {
		t.Errorf("the two regions admitted %d of 20 requests under the override, want its limit, 6", admitted)
	}
}

// TestGlobalServerShownWithoutSecrets: the zones API names the global
// server by its url without its password or query options.
func TestGlobalServerShownWithoutSecrets(t *testing.T) {
	for _, tc := range []struct {
		cfg  RedisConfig
		want string
	}{
		{RedisConfig{URL: "redis://u:s3cret@10.0.0.9:6379/2?dial_timeout=2s"}, "redis://u:***@10.0.0.9:6379/2"},
		{RedisConfig{URL: "rediss://:s3cret@global.internal:6380"}, "rediss://:***@global.internal:6380"},
		{RedisConfig{Addresses: []string{"10.0.0.1:7000", "10.0.0.2:7000"}, Password: "s3cret"}, "10.0.0.1:7000,10.0.0.2:7000"},
		{RedisConfig{Addresses: []string{"10.0.0.1:26379"}, MasterName: "main"}, "sentinel main at 10.0.0.1:26379"},
	} {
		g := GlobalRedisConfig{RedisConfig: tc.cfg}
		if got := g.server(); got != tc.want || strings.Contains(got, "s3cret") {
			t.Errorf("%+v shown as %q, want %q", tc.cfg, got, tc.want)
		}
	}
}

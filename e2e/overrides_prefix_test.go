package e2e

// End-to-end tests of prefix overrides (?prefix=<p>): set on one Caddy
// process of a fleet on one redis-server and applied by the others, and
// kept by a memory zone across a reload and a restart.

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// prefixView is an override as the admin API lists it: a key's or a
// prefix's.
type prefixView struct {
	Key    string `json:"key"`
	Prefix string `json:"prefix"`
	Action string `json:"action"`
	Limit  int64  `json:"limit"`
}

// prefixPath is the admin API path of prefix p's override in zone.
func prefixPath(zone, p string) string {
	return "/rate_limit/zones/" + url.PathEscape(zone) + "/overrides?prefix=" + url.QueryEscape(p)
}

// listPrefixes is zone's overrides as GET lists them on inst.
func listPrefixes(t *testing.T, inst *caddyproc.Instance, zone string) []prefixView {
	t.Helper()
	var got struct {
		Overrides []prefixView `json:"overrides"`
	}
	if code := adminCall(t, inst, http.MethodGet, overridesPath(zone, ""), &got); code != http.StatusOK {
		t.Fatalf("GET %s: %d", overridesPath(zone, ""), code)
	}
	return got.Overrides
}

// TestPrefixOverridesAcrossInstances: a prefix override set through one
// instance is applied by the other within a second, to every key under
// it and no other; a key's own override set through the other beats it
// everywhere; the listing on either shows both apart; an instance started
// afterwards applies the prefix from its first request; and its delete
// reaches every instance.
func TestPrefixOverridesAcrossInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	fleet := startFleet(t, srv, 2, "", "")
	c := newClient(t)
	start := time.Now()
	if code := adminSend(t, fleet[0], http.MethodPut, prefixPath("fleet", "acme:"), `{"limit": 50}`, nil); code != http.StatusOK {
		t.Fatalf("PUT ?prefix=acme:: %d", code)
	}
	took := waitLimit(t, c, fleet[1], "acme:1", "50", start, time.Second)
	t.Logf("prefix applied on the other instance after %v", took)
	if got, _ := limitSeen(t, c, fleet[1], "globex:1"); got != "5" {
		t.Errorf("a key under no prefix: limit %q, want the zone's 5", got)
	}
	start = time.Now()
	if code, body := fleetCall(t, fleet[1], http.MethodPut, "fleet", "acme:1", `{"limit": 7}`); code != http.StatusOK {
		t.Fatalf("PUT ?key=acme:1: %d %s", code, body)
	}
	waitLimit(t, c, fleet[0], "acme:1", "7", start, time.Second)
	if got, _ := limitSeen(t, c, fleet[0], "acme:2"); got != "50" {
		t.Errorf("acme:2 beside acme:1's own override: limit %q, want the prefix's 50", got)
	}
	for _, inst := range fleet {
		list := listPrefixes(t, inst, "fleet")
		if len(list) != 2 || list[0] != (prefixView{Key: "acme:1", Action: "limit", Limit: 7}) || list[1] != (prefixView{Prefix: "acme:", Action: "limit", Limit: 50}) {
			t.Errorf("list on %s: %+v, want acme:1's, then the prefix's", inst.Addr("http"), list)
		}
	}
	late := caddyproc.Start(t, fleetSite(srv.Addr(), "fleet-late", "", ""))
	if got, _ := limitSeen(t, c, late, "acme:3"); got != "50" {
		t.Errorf("an instance started after the prefix: first request's limit %q, want 50", got)
	}
	start = time.Now()
	if code := adminSend(t, fleet[1], http.MethodDelete, prefixPath("fleet", "acme:"), "", nil); code != http.StatusOK {
		t.Fatalf("DELETE ?prefix=acme:: %d", code)
	}
	for _, inst := range []*caddyproc.Instance{fleet[0], late} {
		waitLimit(t, c, inst, "acme:2", "5", start, time.Second)
	}
}

// TestPrefixOverrideKeptAcrossReloadAndRestart: a memory zone's prefix
// override, with the counts of the keys under it, survives a reload, and
// the override survives a restart (saved in Caddy's storage, its name
// holding NULs), listed as a prefix's.
func TestPrefixOverrideKeptAcrossReloadAndRestart(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")
	if code := adminSend(t, inst, http.MethodPut, prefixPath("plan", "acme:"), `{"limit": 4}`, nil); code != http.StatusOK {
		t.Fatalf("PUT ?prefix=acme:: %d", code)
	}
	wantLimit(t, "acme:1 before the reload", sequence(t, c, 2, url, "X-Client", "acme:1"), "plan", 4, 200, 200)
	if err := inst.Load(overridesSite(true, "\thandle /extra {\n\t\trespond \"extra\"\n\t}\n")); err != nil {
		t.Fatal(err)
	}
	wantLimit(t, "acme:1 after the reload", sequence(t, c, 3, url, "X-Client", "acme:1"), "plan", 4, 200, 200, 429)
	inst.Restart()
	url = inst.URL("/plan")
	if list := listPrefixes(t, inst, "plan"); len(list) != 1 || list[0] != (prefixView{Prefix: "acme:", Action: "limit", Limit: 4}) {
		t.Errorf("GET overrides after the restart: %+v, want the prefix's", list)
	}
	wantLimit(t, "acme:2 after the restart", sequence(t, c, 1, url, "X-Client", "acme:2"), "plan", 4, 200)
	wantLimit(t, "acme after the restart", sequence(t, c, 1, url, "X-Client", "acme"), "plan", 3, 200)
}

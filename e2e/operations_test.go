package e2e

// End-to-end tests of operating Floodgate: the admin API, metrics, decision
// samples, through a real Caddy (and a real redis-server for redis zones).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestAdminAPI: every route, against memory, redis and tiered zones: list
// the zones; inspect a key (with / and : in it) without consuming, reset
// it so its next request passes, and no other key or zone changes; the
// hottest keys; 404 for an unknown zone and 400 for a bad query, as JSON.
func TestAdminAPI(t *testing.T) {
	t.Parallel()
	inst, c := startOperations(t)

	var list []map[string]any
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &list); code != 200 {
		t.Fatalf("GET /rate_limit/zones: %d", code)
	}
	byZone := map[string][]map[string]any{}
	for _, z := range list {
		byZone[z["zone"].(string)] = append(byZone[z["zone"].(string)], z)
	}
	if len(byZone["shared"]) != 2 || len(byZone["mem"]) != 1 || len(byZone["red"]) != 1 {
		t.Fatalf("zones listed: %v", list)
	}
	if m := byZone["mem"][0]; m["store"] != "memory" || m["algorithm"] != "fixed_window" || m["limit"] != 3.0 || m["window"] != 3600.0 || m["store_up"] != true {
		t.Errorf("mem listed as %v", m)
	}
	if r := byZone["red"][0]; r["store"] != "redis" || r["store_up"] != true {
		t.Errorf("red listed as %v", r)
	}

	const key = "a/b:c"
	escaped := url.QueryEscape(key)
	for _, zone := range []string{"mem", "red"} {
		path := "/" + zone
		wantCodes(t, zone+" before", sequence(t, c, 4, inst.URL(path), "X-Client", key), 200, 200, 200, 429)
		wantCodes(t, zone+" other key", sequence(t, c, 2, inst.URL(path), "X-Client", "other"), 200, 200)
		var st map[string]any
		for range 2 { // inspecting consumes nothing
			if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/"+zone+"?key="+escaped, &st); code != 200 {
				t.Fatalf("inspect %s: %d %v", zone, code, st)
			}
		}
		if st["zone"] != zone || st["key"] != key || st["limit"] != 3.0 || st["remaining"] != 0.0 || st["reset_after"].(float64) <= 0 {
			t.Errorf("inspect %s: %v", zone, st)
		}
		if code := adminCall(t, inst, http.MethodDelete, "/rate_limit/zones/"+zone+"?key="+escaped, &st); code != 200 || st["reset"] != true {
			t.Fatalf("reset %s: %d %v", zone, code, st)
		}
		adminCall(t, inst, http.MethodGet, "/rate_limit/zones/"+zone+"?key="+escaped, &st)
		if st["remaining"] != 3.0 {
			t.Errorf("%s after the reset: %v", zone, st)
		}
		wantCodes(t, zone+" after the reset", sequence(t, c, 1, inst.URL(path), "X-Client", key), 200)
		adminCall(t, inst, http.MethodGet, "/rate_limit/zones/"+zone+"?key=other", &st)
		if st["remaining"] != 1.0 {
			t.Errorf("%s: another key after the reset: %v, want its 1 remaining untouched", zone, st)
		}
	}
	// The reset of mem's key left the same key of the redis zone alone, and
	// the reverse: each was checked above after its own reset.

	// Tiers: the tier's own state and limit.
	wantCodes(t, "gold", sequence(t, c, 2, inst.URL("/tiered"), "X-Client", "k", "X-Plan", "gold"), 200, 200)
	var st map[string]any
	adminCall(t, inst, http.MethodGet, "/rate_limit/zones/tiered?key=k&tier=gold", &st)
	if st["limit"] != 5.0 || st["remaining"] != 3.0 || st["tier"] != "gold" {
		t.Errorf("tier gold: %v", st)
	}
	adminCall(t, inst, http.MethodGet, "/rate_limit/zones/tiered?key=k", &st)
	if st["limit"] != 3.0 || st["remaining"] != 3.0 {
		t.Errorf("tiered zone's own limit: %v", st)
	}
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/tiered?key=k&tier=silver", &st); code != 400 {
		t.Errorf("unknown tier: %d %v, want 400", code, st)
	}

	// A name two handlers declare: an answer for each.
	wantCodes(t, "shared1", sequence(t, c, 1, inst.URL("/shared1"), "X-Client", "s"), 200)
	var both []map[string]any
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/shared?key=s", &both); code != 200 || len(both) != 2 {
		t.Errorf("shared zone inspected: %d %v, want an answer per handler", code, both)
	}

	// Top keys: hashes, unless log_key.
	for range 3 {
		get(t, c, inst.URL("/logged"), "X-Client", "hot")
	}
	get(t, c, inst.URL("/logged"), "X-Client", "cold")
	var top zoneTop
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/logged/top?n=1", &top); code != 200 || len(top.Keys) != 1 || top.Keys[0].Key != "hot" || top.Keys[0].Requests != 3 {
		t.Errorf("top of a log_key zone: %d %+v, want the raw key hot with 3 requests", code, top)
	}
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/mem/top", &top); code != 200 || len(top.Keys) < 2 || top.Keys[0].Key != keyHash(key) || top.Keys[0].Denied != 1 {
		t.Errorf("top of mem: %d %+v, want %s (the hash of %q) first with 1 refusal", code, top, keyHash(key), key)
	}

	// Errors, as JSON.
	var apiErr struct {
		Error string `json:"error"`
	}
	for _, e := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/rate_limit/zones/nope?key=k", 404},
		{http.MethodDelete, "/rate_limit/zones/nope?key=k", 404},
		{http.MethodGet, "/rate_limit/zones/nope/top", 404},
		{http.MethodGet, "/rate_limit/zones/mem", 400},
		{http.MethodDelete, "/rate_limit/zones/mem?key=", 400},
		{http.MethodGet, "/rate_limit/zones/mem/top?n=0", 400},
		{http.MethodGet, "/rate_limit/zones/mem/top?n=x", 400},
		{http.MethodPost, "/rate_limit/zones/mem?key=k", 405},
	} {
		apiErr.Error = ""
		if code := adminCall(t, inst, e.method, e.path, &apiErr); code != e.code || apiErr.Error == "" {
			t.Errorf("%s %s: %d %q, want %d with a JSON error", e.method, e.path, code, apiErr.Error, e.code)
		}
	}
}

// TestOperationsMetrics: every metric docs/metrics.md lists is exported, none is
// labelled by key, so 10,000 distinct keys add no series; they survive a
// reload without being registered twice; disable_metrics leaves a zone
// out of them.
func TestOperationsMetrics(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := func(body string) string {
		return globalsWith("") + fmt.Sprintf(`
http://{{http}} {
	handle /mem {
		rate_limit {
			zone mem {
				key {header.X-Client}
				rate 1000/1h
			}
		}
		respond %q
	}
	handle /red {
		rate_limit {
			zone red {
				key {header.X-Client}
				algorithm fixed_window
				rate 2/1h
				store redis
				local_quota 0.5
			}
			redis {
				url redis://%s
				timeout 2s
			}
		}
		respond %q
	}
	handle /quiet {
		rate_limit {
			zone quiet {
				rate 5/1h
			}
			disable_metrics
		}
		respond "ok"
	}
}
`, body, srv.Addr(), body)
	}
	inst := caddyproc.Start(t, cfg("v1"))
	c := newClient(t)
	series := func() map[string]string { return rateLimitSeries(t, c, inst) }
	wantCodes(t, "red", sequence(t, c, 4, inst.URL("/red"), "X-Client", "k"), 200, 200, 429, 429)
	get(t, c, inst.URL("/quiet"))
	before := series()
	for i := range 10_000 {
		r := get(t, c, inst.URL("/mem"), "X-Client", fmt.Sprintf("client-%d", i))
		if r.code != 200 {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}
	after := series()
	if len(after) > len(before)+30 {
		t.Errorf("%d series before 10,000 distinct keys, %d after: a metric grows with keys", len(before), len(after))
	}
	for _, want := range []string{
		`caddy_http_rate_limit_decisions_total{result="allowed",zone="mem"}`,
		`caddy_http_rate_limit_decisions_total{result="denied",zone="red"}`,
		`caddy_http_rate_limit_decision_seconds_count{zone="red"}`,
		`caddy_http_rate_limit_decision_seconds_bucket{zone="red",le="0.0001"}`,
		`caddy_http_rate_limit_local_decisions_total{source="lease",zone="red"}`,
		`caddy_http_rate_limit_local_decisions_total{source="deny_cache",zone="red"}`,
		`caddy_http_rate_limit_keys{zone="mem"}`,
		`caddy_http_rate_limit_store_up{zone="red"}`,
		`caddy_http_rate_limit_store_failures_total{fail="open",zone="red"}`,
	} {
		if _, ok := after[want]; !ok {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if got := after[`caddy_http_rate_limit_decisions_total{result="allowed",zone="mem"}`]; got != "10000" {
		t.Errorf("mem allowed %s times, want 10000", got)
	}
	if got := after[`caddy_http_rate_limit_keys{zone="mem"}`]; got != "10000" {
		t.Errorf("mem holds %s keys, want 10000", got)
	}
	if got := after[`caddy_http_rate_limit_store_up{zone="red"}`]; got != "1" {
		t.Errorf("red store_up %s, want 1", got)
	}
	// One lease for the 2 admitted; the second refusal came from the cache.
	if got := after[`caddy_http_rate_limit_local_decisions_total{source="deny_cache",zone="red"}`]; got != "1" {
		t.Errorf("red refusals from the denial cache: %s, want 1", got)
	}
	if _, timed := after[`caddy_http_rate_limit_decision_seconds_count{zone="mem"}`]; timed {
		t.Errorf("memory zone mem is timed: only redis zones are")
	}
	for name := range after {
		if strings.Contains(name, "quiet") {
			t.Errorf("zone quiet, with disable_metrics, is in %s", name)
		}
		if strings.Contains(name, "client-") {
			t.Errorf("a key in a label: %s", name)
		}
	}
	if err := inst.Load(cfg("v2")); err != nil {
		t.Fatalf("reload: %v\n%s", err, inst.Log())
	}
	if r := get(t, c, inst.URL("/mem"), "X-Client", "after"); r.code != 200 || r.body != "v2" {
		t.Fatalf("after the reload: %d %q", r.code, r.body)
	}
	reloaded := series()
	if got := reloaded[`caddy_http_rate_limit_decisions_total{result="allowed",zone="mem"}`]; got != "10001" {
		t.Errorf("after a reload, mem allowed %s times, want 10001: counters must carry on", got)
	}
	if got := reloaded[`caddy_http_rate_limit_keys{zone="mem"}`]; got != "10001" {
		t.Errorf("after a reload, mem holds %s keys, want 10001", got)
	}
}

// TestOperationsSamples: log_sample 1 logs every decision with its fields;
// 0.1 logs about a tenth (within five standard deviations over 2,000
// decisions); 0 logs none.
func TestOperationsSamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fraction string
		n        int
		lo, hi   int
	}{
		{"1", 300, 300, 300},
		{"0.1", 2000, 200 - 67, 200 + 67},
		{"0", 300, 0, 0},
	} {
		t.Run(c.fraction, func(t *testing.T) {
			t.Parallel()
			inst := caddyproc.Start(t, globals+`
http://{{http}} {
	handle /marker {
		rate_limit {
			zone marker {
				rate 100/1h
			}
			log_sample 1
		}
		respond "ok"
	}
	handle {
		rate_limit {
			zone sampled {
				key {header.X-Client}
				rate 100000/1h
			}
			log_sample `+c.fraction+`
		}
		respond "ok"
	}
}
`)
			client := newClient(t)
			for i := range c.n {
				get(t, client, inst.URL("/"), "X-Client", fmt.Sprintf("c%d", i%7))
			}
			// Caddy's log reaches the test through a pipe: once the
			// marker's sample, logged after every other, has arrived, so
			// have they.
			get(t, client, inst.URL("/marker"))
			testutil.Eventually(t, "the marker's sample in Caddy's log", func() error {
				if !strings.Contains(inst.Log(), `"zone":"marker"`) {
					return errors.New("not logged yet")
				}
				return nil
			})
			var lines []map[string]any
			for line := range strings.SplitSeq(inst.Log(), "\n") {
				if !strings.Contains(line, `"rate limit decision"`) || !strings.Contains(line, `"zone":"sampled"`) {
					continue
				}
				var entry map[string]any
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				lines = append(lines, entry)
			}
			if len(lines) < c.lo || len(lines) > c.hi {
				t.Fatalf("log_sample %s: %d of %d decisions logged, want %d to %d", c.fraction, len(lines), c.n, c.lo, c.hi)
			}
			if len(lines) > 0 {
				e := lines[0]
				if e["zone"] != "sampled" || e["allowed"] != true || e["source"] != "memory" || e["key_hash"] == nil || e["duration"] == nil || e["remaining"] == nil {
					t.Errorf("sample %v: want zone, allowed, remaining, source, duration and key_hash", e)
				}
				if _, raw := e["key"]; raw {
					t.Errorf("sample %v logs the raw key without log_key", e)
				}
			}
		})
	}
}

// TestAdminKeyAsTyped: inspect and reset take a client's full IP, IPv6 or
// IPv4, and find the state of the prefix the zone groups it into, as the
// request path does; reset says whether any state existed, for a memory
// zone and a redis zone, and counts a refusal only the redis zone's denial
// cache still held (its Redis state gone).
func TestAdminKeyAsTyped(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	zone := func(path, name, opts string) string {
		return `	handle ` + path + ` {
		rate_limit {
			zone ` + name + ` {
				key ip
				algorithm fixed_window
				rate 2/1h
` + opts + `			}
			redis {
				url redis://` + srv.Addr() + `
				timeout 2s
			}
		}
		respond "ok"
	}
`
	}
	inst := caddyproc.Start(t, globals+"\nhttp://{{http}} {\n"+
		zone("/mem", "mem", "\t\t\t\tipv4_prefix 24\n")+
		zone("/red", "red", "\t\t\t\tstore redis\n\t\t\t\tdeny_cache 1m\n")+
		"}\n")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	c := newClient(t)
	const xff = "X-Forwarded-For"
	inspect := func(zone, key string) map[string]any {
		t.Helper()
		var st map[string]any
		if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/"+zone+"?key="+url.QueryEscape(key), &st); code != 200 {
			t.Fatalf("inspect %s %s: %d %v", zone, key, code, st)
		}
		return st
	}
	reset := func(zone, key string, want bool) {
		t.Helper()
		var st map[string]any
		if code := adminCall(t, inst, http.MethodDelete, "/rate_limit/zones/"+zone+"?key="+url.QueryEscape(key), &st); code != 200 || st["reset"] != want {
			t.Errorf("reset %s %s: %d %v, want reset %v", zone, key, code, st, want)
		}
	}
	for _, z := range []string{"mem", "red"} {
		// An IPv6 client: its /64 is the key (default ipv6_prefix 64).
		wantCodes(t, z+" IPv6 client", sequence(t, c, 3, inst.URL("/"+z), xff, "2001:db8:1:2::7"), 200, 200, 429)
		st := inspect(z, "2001:db8:1:2:aaaa::1")
		if st["remaining"] != 0.0 || st["key"] != "2001:db8:1:2::" {
			t.Errorf("inspect %s of another address of the client's /64: %v, want its key 2001:db8:1:2:: with 0 remaining", z, st)
		}
		reset(z, "2001:db8:1:2::7", true)
		if st := inspect(z, "2001:db8:1:2::7"); st["remaining"] != 2.0 {
			t.Errorf("inspect %s after the reset: %v, want 2 remaining", z, st)
		}
		wantCodes(t, z+" IPv6 client after the reset", sequence(t, c, 1, inst.URL("/"+z), xff, "2001:db8:1:2::7"), 200)
		reset(z, "2001:db8:ffff::1", false) // never seen
		reset(z, "no-such-key", false)
	}
	// An IPv4 client of a zone with ipv4_prefix 24.
	wantCodes(t, "mem IPv4 client", sequence(t, c, 3, inst.URL("/mem"), xff, "198.51.100.7"), 200, 200, 429)
	if st := inspect("mem", "198.51.100.99"); st["remaining"] != 0.0 || st["key"] != "198.51.100.0" {
		t.Errorf("inspect of another address of the client's /24: %v, want key 198.51.100.0 with 0 remaining", st)
	}
	reset("mem", "198.51.100.99", true)
	wantCodes(t, "mem IPv4 client after the reset", sequence(t, c, 1, inst.URL("/mem"), xff, "198.51.100.7"), 200)
	reset("mem", "198.51.100.7", true) // the request after the reset left state
	reset("mem", "198.51.100.7", false)

	// A refusal the denial cache holds counts, though Redis has forgotten
	// the key.
	wantCodes(t, "red refused", sequence(t, c, 3, inst.URL("/red"), xff, "2001:db8:9::1"), 200, 200, 429)
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	reset("red", "2001:db8:9::1", true)
	reset("red", "2001:db8:9::1", false)
}

package e2e

// End-to-end tests of runtime overrides on memory zones: the admin API's
// /overrides routes through a real Caddy, and what requests, the headers,
// inspect, rate_limit_status and /metrics make of an override; kept across
// a reload and a restart, ignored while its zone is out of the config.

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
)

// overridesSite serves, on {{http}}: /plan, a 3/1h zone with a gold tier
// of 5/1h; /two, zones ex (2/1h) and side (10/1h) on one handler; /ip, a
// zone keyed by client IP grouped by /24; /bucket, a token bucket; /other,
// a zone that stays when /plan's goes (withPlan false); /status, every
// zone's rate_limit_status. Every zone but ip keys on X-Client, and every
// one counts by an unaligned algorithm, so no test meets a window's edge.
func overridesSite(withPlan bool, extra string) string {
	plan := `	handle /plan {
		rate_limit {
			zone plan {
				key {header.X-Client}
				rate 3/1h
				tier {header.X-Plan} {
					gold 5/1h
				}
			}
		}
		respond "ok"
	}
`
	if !withPlan {
		plan = "\thandle /plan {\n\t\trespond \"ok\"\n\t}\n"
	}
	return globals + `
http://{{http}} {
` + plan + `	handle /two {
		rate_limit {
			zone ex {
				key {header.X-Client}
				rate 2/1h
			}
			zone side {
				key {header.X-Client}
				rate 10/1h
			}
		}
		respond "ok"
	}
	handle /ip {
		rate_limit {
			zone ip {
				key {client_ip}
				ipv4_prefix 24
				rate 3/1h
			}
		}
		respond "ok"
	}
	handle /bucket {
		rate_limit {
			zone bucket {
				key {header.X-Client}
				algorithm token_bucket
				rate 3/1h
				burst 3
			}
		}
		respond "ok"
	}
	handle /other {
		rate_limit {
			zone other {
				key {header.X-Client}
				rate 3/1h
			}
		}
		respond "ok"
	}
	handle /status {
		rate_limit_status
	}
` + extra + `}
`
}

// startOverrides runs overridesSite, whose log the test shows if it fails.
func startOverrides(t *testing.T) (*caddyproc.Instance, *http.Client) {
	t.Helper()
	inst := caddyproc.Start(t, overridesSite(true, ""))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	return inst, newClient(t)
}

// zoneOverride answers PUT and GET ?key=.
type zoneOverride struct {
	Zone     string       `json:"zone"`
	Override overrideView `json:"override"`
}

// zoneOverrides answers GET without a key.
type zoneOverrides struct {
	Zone      string         `json:"zone"`
	Overrides []overrideView `json:"overrides"`
}

// overrideRemoval answers DELETE.
type overrideRemoval struct {
	Zone    string `json:"zone"`
	Key     string `json:"key"`
	Deleted bool   `json:"deleted"`
}

// inspected is inspect's answer with the override it reports.
type inspected struct {
	keyReport
	Override *overrideView `json:"override"`
}

// apiError is the admin API's error answer.
type apiError struct {
	Error string `json:"error"`
}

// putOverride sets key's override in zone, failing the test unless the
// API took it, and returns the override as answered.
func putOverride(t *testing.T, inst *caddyproc.Instance, zone, key, body string) overrideView {
	t.Helper()
	var got zoneOverride
	if code := adminSend(t, inst, http.MethodPut, overridesPath(zone, key), body, &got); code != http.StatusOK {
		t.Fatalf("PUT %s %s: %d %+v", overridesPath(zone, key), body, code, got)
	}
	if got.Zone != zone {
		t.Errorf("PUT %s: answered for zone %q", overridesPath(zone, key), got.Zone)
	}
	return got.Override
}

// deleteOverride removes key's override from zone and returns whether
// there was one.
func deleteOverride(t *testing.T, inst *caddyproc.Instance, zone, key string) bool {
	t.Helper()
	var got overrideRemoval
	if code := adminSend(t, inst, http.MethodDelete, overridesPath(zone, key), "", &got); code != http.StatusOK {
		t.Fatalf("DELETE %s: %d %+v", overridesPath(zone, key), code, got)
	}
	return got.Deleted
}

// listOverrides is zone's overrides as GET lists them.
func listOverrides(t *testing.T, inst *caddyproc.Instance, zone string) []overrideView {
	t.Helper()
	var got zoneOverrides
	if code := adminCall(t, inst, http.MethodGet, overridesPath(zone, ""), &got); code != http.StatusOK {
		t.Fatalf("GET %s: %d", overridesPath(zone, ""), code)
	}
	return got.Overrides
}

// inspectKey is inspect's answer for key in zone (the zone's own limit).
func inspectKey(t *testing.T, inst *caddyproc.Instance, zone, key string) inspected {
	t.Helper()
	var st inspected
	path := "/rate_limit/zones/" + url.PathEscape(zone) + "?key=" + url.QueryEscape(key)
	if code := adminCall(t, inst, http.MethodGet, path, &st); code != http.StatusOK {
		t.Fatalf("GET %s: %d %+v", path, code, st)
	}
	return st
}

// wantLimit checks that every response reports limit as X-RateLimit-Limit
// and as zone's q in RateLimit-Policy, and its statuses are codes.
func wantLimit(t *testing.T, what string, rs []response, zone string, limit int64, codes ...int) {
	t.Helper()
	wantCodes(t, what, rs, codes...)
	for i, r := range rs {
		if got := intHeader(t, r, "X-RateLimit-Limit"); got != limit {
			t.Errorf("%s: response %d: X-RateLimit-Limit %d, want %d", what, i+1, got, limit)
		}
		if got := policyQuota(t, r, zone); got != limit {
			t.Errorf("%s: response %d: RateLimit-Policy q=%d, want %d", what, i+1, got, limit)
		}
	}
}

// oks is n 200s, then the statuses in then.
func oks(n int, then ...int) []int {
	out := make([]int, n, n+len(then))
	for i := range out {
		out[i] = http.StatusOK
	}
	return append(out, then...)
}

// TestOverridePrecedence: an override wins over the key's tier and the
// zone's limit, whatever the request's tier, with state of its own (a
// key that spent a tier request still has the override's whole limit);
// other keys keep their tier's and the zone's limits; once deleted, the
// key is its tier's again, with the tier's state as it was.
func TestOverridePrecedence(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")
	gold := func(client string) []string { return []string{"X-Client", client, "X-Plan", "gold"} }

	wantLimit(t, "a as gold", sequence(t, c, 1, url, gold("a")...), "plan", 5, 200)
	v := putOverride(t, inst, "plan", "a", `{"limit": 8, "window": "1h"}`)
	if v != (overrideView{Key: "a", Action: "limit", Limit: 8, Window: "1h0m0s"}) {
		t.Errorf("PUT answered %+v", v)
	}
	rs := sequence(t, c, 2, url, gold("a")...)
	wantLimit(t, "a as gold under its override", rs, "plan", 8, 200, 200)
	wantRemaining(t, "a as gold under its override", rs, "plan", 7, 6)
	rs = sequence(t, c, 6, url, "X-Client", "a")
	wantLimit(t, "a without a tier under its override", rs, "plan", 8, oks(6)...)
	wantRemaining(t, "a without a tier under its override", rs, "plan", 5, 4, 3, 2, 1, 0)
	wantLimit(t, "a spent its override", sequence(t, c, 1, url, gold("a")...), "plan", 8, 429)

	wantLimit(t, "b as gold", sequence(t, c, 1, url, gold("b")...), "plan", 5, 200)
	wantLimit(t, "c without a tier", sequence(t, c, 1, url, "X-Client", "c"), "plan", 3, 200)

	if !deleteOverride(t, inst, "plan", "a") {
		t.Error("DELETE of a's override: deleted false")
	}
	rs = sequence(t, c, 1, url, gold("a")...)
	wantLimit(t, "a as gold after the delete", rs, "plan", 5, 200)
	wantRemaining(t, "a as gold after the delete", rs, "plan", 3)
}

// TestOverrideFreshState: an override's limit starts with state of its
// own, and starts afresh whenever the key's limit changes (to another
// limit, back to an earlier one, or set again after a delete); the same
// limit set again with only a new expiry keeps its state; the zone's own
// state is never touched by the override's.
func TestOverrideFreshState(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")
	k := clientHeader("k")

	wantLimit(t, "k spends the zone's 3", sequence(t, c, 4, url, k...), "plan", 3, oks(3, 429)...)
	putOverride(t, inst, "plan", "k", `{"limit": 5, "window": "1h"}`)
	wantLimit(t, "k under 5/1h", sequence(t, c, 6, url, k...), "plan", 5, oks(5, 429)...)
	putOverride(t, inst, "plan", "k", `{"limit": 7, "window": "1h"}`)
	wantLimit(t, "k under 7/1h", sequence(t, c, 8, url, k...), "plan", 7, oks(7, 429)...)
	putOverride(t, inst, "plan", "k", `{"limit": 5, "window": "1h"}`)
	wantLimit(t, "k back under 5/1h", sequence(t, c, 6, url, k...), "plan", 5, oks(5, 429)...)
	putOverride(t, inst, "plan", "k", `{"limit": 5, "window": "1h", "expires": "1h"}`)
	wantLimit(t, "k under 5/1h with an expiry", sequence(t, c, 1, url, k...), "plan", 5, 429)

	deleteOverride(t, inst, "plan", "k")
	wantLimit(t, "k under the zone again", sequence(t, c, 1, url, k...), "plan", 3, 429)
	putOverride(t, inst, "plan", "k", `{"limit": 5, "window": "1h"}`)
	wantLimit(t, "k under 5/1h set again", sequence(t, c, 6, url, k...), "plan", 5, oks(5, 429)...)
}

// TestOverrideBlock: a blocked key is answered 429 without touching any
// state, with Retry-After the seconds to the block's expiry, or an hour
// for a block without one; RateLimit-Policy and X-RateLimit-Limit say a
// quota of 0; inspect and rate_limit_status show the block; other keys
// are unaffected; and the decisions count in decisions_total and
// override_decisions_total.
func TestOverrideBlock(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")

	putOverride(t, inst, "plan", "x", `{"action": "block", "expires": "30s"}`)
	putOverride(t, inst, "plan", "y", `{"action": "block"}`)
	for _, r := range sequence(t, c, 2, url, "X-Client", "x") {
		checkDenial(t, r, "plan", 29, 30)
		if p := r.header.Get("RateLimit-Policy"); p != `"plan";q=0;w=3600` {
			t.Errorf("blocked for 30s: RateLimit-Policy %q, want q=0", p)
		}
		if l := intHeader(t, r, "X-RateLimit-Limit"); l != 0 {
			t.Errorf("blocked for 30s: X-RateLimit-Limit %d, want 0", l)
		}
	}
	for _, r := range sequence(t, c, 2, url, "X-Client", "y", "X-Plan", "gold") {
		checkDenial(t, r, "plan", 3600, 3600)
	}
	wantLimit(t, "another key", sequence(t, c, 3, url, "X-Client", "z"), "plan", 3, oks(3)...)

	st := inspectKey(t, inst, "plan", "x")
	if st.Override == nil || st.Override.Action != "block" || st.Override.ExpiresIn <= 28 || st.Override.ExpiresIn > 30 {
		t.Errorf("inspect of a blocked key: override %+v", st.Override)
	}
	if st.Limit != 0 || st.Remaining != 0 || st.ResetAfter <= 28 || st.ResetAfter > 30 {
		t.Errorf("inspect of a key blocked for 30s: %+v, want limit 0, remaining 0, reset_after about 30", st.keyReport)
	}
	got, _ := askStatus(t, c, inst.URL("/status"), nil, "X-Client", "y")
	if z := got["plan"]; z.Limit != 0 || z.Remaining != 0 || z.Reset != 3600 || z.Window != 3600 {
		t.Errorf("rate_limit_status of a key blocked for good: %+v, want limit 0, reset 3600", z)
	}

	wantSeries(t, c, inst, map[string]string{
		`caddy_http_rate_limit_override_decisions_total{action="block",zone="plan"}`: "4",
		`caddy_http_rate_limit_decisions_total{result="denied",zone="plan"}`:         "4",
		`caddy_http_rate_limit_decisions_total{result="allowed",zone="plan"}`:        "3",
		`caddy_http_rate_limit_overrides{zone="plan"}`:                               "2",
	})
}

// TestOverrideExempt: an exempt key is never limited and gets no fields
// from its zone, while another zone of the handler still limits it and
// writes its own; a zone alone on its route writes nothing at all; other
// keys are limited as before; inspect shows the exemption and
// rate_limit_status leaves the zone out.
func TestOverrideExempt(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)

	putOverride(t, inst, "ex", "e", `{"action": "exempt"}`)
	rs := sequence(t, c, 5, inst.URL("/two"), "X-Client", "e")
	wantCodes(t, "e on /two", rs, oks(5)...)
	for i, r := range rs {
		for _, field := range []string{"RateLimit", "RateLimit-Policy"} {
			if m := fieldMembers(t, r, field); len(m) != 1 || m[0].zone != "side" {
				t.Errorf("response %d: %s %q, want side's member alone", i+1, field, r.header.Get(field))
			}
		}
		if l := intHeader(t, r, "X-RateLimit-Limit"); l != 10 {
			t.Errorf("response %d: X-RateLimit-Limit %d, want side's 10", i+1, l)
		}
	}
	wantRemaining(t, "side still counts e", rs, "side", 9, 8, 7, 6, 5)
	wantCodes(t, "f on /two", sequence(t, c, 3, inst.URL("/two"), "X-Client", "f"), 200, 200, 429)

	putOverride(t, inst, "plan", "e", `{"action": "exempt"}`)
	for i, r := range sequence(t, c, 5, inst.URL("/plan"), "X-Client", "e", "X-Plan", "gold") {
		if r.code != http.StatusOK || r.hasRateLimitHeaders() {
			t.Errorf("exempt on /plan, response %d: %d %v, want 200 without rate-limit fields", i+1, r.code, r.header)
		}
	}

	st := inspectKey(t, inst, "ex", "e")
	if st.Override == nil || st.Override.Action != "exempt" || st.Limit != 0 {
		t.Errorf("inspect of an exempt key: %+v %+v", st.keyReport, st.Override)
	}
	got, _ := askStatus(t, c, inst.URL("/status"), nil, "X-Client", "e")
	if _, ok := got["ex"]; ok {
		t.Errorf("rate_limit_status answered zone ex for a key exempt from it: %+v", got)
	}
	wantStatus(t, "side for e", got, "side", 10, 5, 3600)

	wantSeries(t, c, inst, map[string]string{
		`caddy_http_rate_limit_override_decisions_total{action="exempt",zone="ex"}`:   "5",
		`caddy_http_rate_limit_override_decisions_total{action="exempt",zone="plan"}`: "5",
		`caddy_http_rate_limit_decisions_total{result="allowed",zone="ex"}`:           "7",
	})
}

// TestOverrideExpiresExactly: an override decides its key until the
// instant it expires and the zone from then on, to the millisecond: every
// request answered before an expiry given as an RFC 3339 time is decided
// by the override, every one sent after it by the zone (only a request in
// flight at that instant could be either). An expiry given as a duration
// (2s) counts from the PUT: the override still applies 1.5 s after it and
// no longer 2.5 s after. A lapsed override is listed no more, and inspect
// shows none.
func TestOverrideExpiresExactly(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")

	putStart := time.Now()
	v := putOverride(t, inst, "plan", "rel", `{"limit": 100, "window": "1h", "expires": "2s"}`)
	putDone := time.Now()
	if v.Expires == "" || v.ExpiresIn <= 1.9 || v.ExpiresIn > 2 {
		t.Errorf("PUT with expires 2s answered %+v", v)
	}
	at := putDone.Add(time.Second).Truncate(time.Millisecond)
	putOverride(t, inst, "plan", "abs", `{"limit": 100, "window": "1h", "expires": "`+at.UTC().Format(time.RFC3339Nano)+`"}`)

	var before, after int
	time.Sleep(time.Until(at.Add(-300 * time.Millisecond)))
	for time.Now().Before(at.Add(300 * time.Millisecond)) {
		r := get(t, c, url, "X-Client", "abs")
		limit := intHeader(t, r, "X-RateLimit-Limit")
		switch {
		case r.done.Before(at):
			before++
			if limit != 100 {
				t.Errorf("a request answered %v before the expiry was decided by limit %d, want the override's 100", at.Sub(r.done), limit)
			}
		case r.start.After(at):
			after++
			if limit != 3 {
				t.Errorf("a request sent %v after the expiry was decided by limit %d, want the zone's 3", r.start.Sub(at), limit)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if before == 0 || after == 0 {
		t.Errorf("%d requests judged before the expiry and %d after: the machine is too slow for the test", before, after)
	}

	time.Sleep(time.Until(putDone.Add(1500 * time.Millisecond)))
	wantLimit(t, "1.5s after the PUT", sequence(t, c, 1, url, "X-Client", "rel"), "plan", 100, 200)
	time.Sleep(time.Until(putStart.Add(2500 * time.Millisecond)))
	wantLimit(t, "2.5s after the PUT", sequence(t, c, 1, url, "X-Client", "rel"), "plan", 3, 200)

	if l := listOverrides(t, inst, "plan"); len(l) != 0 {
		t.Errorf("lapsed overrides are listed: %+v", l)
	}
	if st := inspectKey(t, inst, "plan", "rel"); st.Override != nil || st.Limit != 3 || st.Remaining != 2 {
		t.Errorf("inspect after the expiry: %+v %+v, want the zone's state and no override", st.keyReport, st.Override)
	}
	if code := adminCall(t, inst, http.MethodGet, overridesPath("plan", "rel"), nil); code != http.StatusNotFound {
		t.Errorf("GET of a lapsed override: %d, want 404", code)
	}
}

// TestOverrideReflected: an override's limit is what every view of its
// key reports: X-RateLimit-*, RateLimit and RateLimit-Policy (its own
// window), inspect (with the override), rate_limit_status, the list and
// GET of one key; /metrics counts its decisions by action and the
// overrides the zone holds.
func TestOverrideReflected(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")

	putOverride(t, inst, "plan", "h", `{"limit": 8, "window": "30m"}`)
	putOverride(t, inst, "plan", "other", `{"limit": 4}`)
	rs := sequence(t, c, 2, url, "X-Client", "h")
	checkPolicy(t, rs, "plan", `"plan";q=8;w=1800`)
	wantRemaining(t, "h", rs, "plan", 7, 6)
	if reset := intParam(t, zoneParams(t, rs[1], "RateLimit", "plan"), "t"); reset < 1 || reset > 1800 {
		t.Errorf("RateLimit t=%d, want within the override's window of 1800", reset)
	}

	st := inspectKey(t, inst, "plan", "h")
	if st.Limit != 8 || st.Remaining != 6 || st.ResetAfter <= 0 || st.ResetAfter > 1800 {
		t.Errorf("inspect: %+v, want limit 8, remaining 6", st.keyReport)
	}
	if st.Override == nil || *st.Override != (overrideView{Key: "h", Action: "limit", Limit: 8, Window: "30m0s"}) {
		t.Errorf("inspect's override: %+v", st.Override)
	}
	got, _ := askStatus(t, c, inst.URL("/status"), nil, "X-Client", "h")
	wantStatus(t, "status of h", got, "plan", 8, 6, 1800)

	list := listOverrides(t, inst, "plan")
	if len(list) != 2 || list[0].Key != "h" || list[1] != (overrideView{Key: "other", Action: "limit", Limit: 4}) {
		t.Errorf("GET overrides: %+v, want h's and other's (with the zone's window), by key", list)
	}
	var one zoneOverride
	if code := adminCall(t, inst, http.MethodGet, overridesPath("plan", "h"), &one); code != 200 || one.Override.Limit != 8 {
		t.Errorf("GET overrides?key=h: %d %+v", code, one)
	}
	rs = sequence(t, c, 1, url, "X-Client", "other")
	checkPolicy(t, rs, "plan", `"plan";q=4;w=3600`)

	wantSeries(t, c, inst, map[string]string{
		`caddy_http_rate_limit_override_decisions_total{action="limit",zone="plan"}`: "3",
		`caddy_http_rate_limit_override_decisions_total{action="block",zone="plan"}`: "0",
		`caddy_http_rate_limit_overrides{zone="plan"}`:                               "2",
		`caddy_http_rate_limit_overrides{zone="ex"}`:                                 "0",
	})
}

// TestOverrideAdminErrors: every refusal of the /overrides routes is a
// JSON error with a message that names the fault: 400 for a bad body, a
// limit the zone's algorithm cannot take, a past expiry, a missing or
// oversized key; 404 for an unknown zone and for a key without an
// override; 405 for another method. A burst on a token bucket is taken.
func TestOverrideAdminErrors(t *testing.T) {
	t.Parallel()
	inst, _ := startOverrides(t)
	long := strings.Repeat("k", 1025)
	for _, e := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"PUT", overridesPath("plan", "k"), `{"limit": 5`, 400, "the body must be a JSON object"},
		{"PUT", overridesPath("plan", "k"), `[5]`, 400, "the body must be a JSON object"},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "bogus": 1}`, 400, `unknown field "bogus"`},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "burst": 2}`, 400, "burst applies only to token_bucket and leaky_bucket, not sliding_window_log"},
		{"PUT", overridesPath("plan", "k"), `{"limit": -1}`, 400, "limit must be positive, got -1"},
		{"PUT", overridesPath("plan", "k"), `{"limit": 0}`, 400, "limit must be positive, got 0"},
		{"PUT", overridesPath("plan", "k"), `{"window": "1h"}`, 400, `give a "limit"`},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "window": "soon"}`, 400, `window "soon" is neither a positive duration`},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "window": "day"}`, 400, `zone "plan" is not a calendar zone`},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "expires": "2020-01-01T00:00:00Z"}`, 400, "is already past"},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "expires": "-5m"}`, 400, "a duration must be positive"},
		{"PUT", overridesPath("plan", "k"), `{"action": "block", "limit": 5}`, 400, "block takes no limit"},
		{"PUT", overridesPath("plan", "k"), `{"action": "ban"}`, 400, `unknown action "ban"`},
		{"PUT", overridesPath("plan", "k"), `{"limit": 5, "padding": "` + strings.Repeat("x", 5000) + `"}`, 400, "larger than"},
		{"PUT", overridesPath("plan", ""), `{"limit": 5}`, 400, "the key query parameter is required"},
		{"PUT", overridesPath("plan", "") + "?key=", `{"limit": 5}`, 400, "the key query parameter is required"},
		{"PUT", overridesPath("plan", long), `{"limit": 5}`, 400, "longer than the 1024"},
		{"DELETE", overridesPath("plan", ""), "", 400, "the key query parameter is required"},
		{"PUT", overridesPath("nope", "k"), `{"limit": 5}`, 404, `no zone "nope" in the running config`},
		{"GET", overridesPath("nope", ""), "", 404, `no zone "nope" in the running config`},
		{"GET", overridesPath("plan", "nobody"), "", 404, `zone "plan" has no override for key "nobody"`},
		{"POST", overridesPath("plan", "k"), `{"limit": 5}`, 405, "method POST not allowed"},
	} {
		var got apiError
		code := adminSend(t, inst, e.method, e.path, e.body, &got)
		if code != e.status || !strings.Contains(got.Error, e.want) {
			t.Errorf("%s %.80s %.60s: %d %q, want %d and %q", e.method, e.path, e.body, code, got.Error, e.status, e.want)
		}
	}
	if l := listOverrides(t, inst, "plan"); len(l) != 0 {
		t.Errorf("refused PUTs left overrides: %+v", l)
	}
	v := putOverride(t, inst, "bucket", "k", `{"limit": 5, "burst": 2}`)
	if v.Burst != 2 || v.Limit != 5 {
		t.Errorf("PUT of a burst on a token bucket: %+v", v)
	}
}

// TestOverrideIPKeyMasked: an IP key is typed as a client's full address
// and grouped by the zone's ipv4_prefix, as inspect takes it: the
// override set for 192.0.2.77 is listed as 192.0.2.0 and applies to every
// client of 192.0.2.0/24 (presented through X-Forwarded-For from the
// trusted loopback proxy), not to another network; GET and DELETE find it
// by any address of the prefix.
func TestOverrideIPKeyMasked(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/ip")

	if v := putOverride(t, inst, "ip", "192.0.2.77", `{"limit": 6}`); v.Key != "192.0.2.0" {
		t.Errorf("PUT for 192.0.2.77 answered key %q, want the zone's 192.0.2.0", v.Key)
	}
	if l := listOverrides(t, inst, "ip"); len(l) != 1 || l[0].Key != "192.0.2.0" {
		t.Errorf("GET overrides: %+v, want the one for 192.0.2.0", l)
	}
	wantLimit(t, "192.0.2.5", sequence(t, c, 2, url, "X-Forwarded-For", "192.0.2.5"), "ip", 6, 200, 200)
	wantLimit(t, "192.0.2.250", sequence(t, c, 1, url, "X-Forwarded-For", "192.0.2.250"), "ip", 6, 200)
	wantLimit(t, "198.51.100.1", sequence(t, c, 1, url, "X-Forwarded-For", "198.51.100.1"), "ip", 3, 200)
	if st := inspectKey(t, inst, "ip", "192.0.2.1"); st.Key != "192.0.2.0" || st.Limit != 6 || st.Remaining != 3 {
		t.Errorf("inspect of 192.0.2.1: %+v, want 192.0.2.0 at 3 of 6", st.keyReport)
	}
	var one zoneOverride
	if code := adminCall(t, inst, http.MethodGet, overridesPath("ip", "192.0.2.200"), &one); code != 200 || one.Override.Key != "192.0.2.0" {
		t.Errorf("GET overrides?key=192.0.2.200: %d %+v", code, one)
	}
	if !deleteOverride(t, inst, "ip", "192.0.2.9") {
		t.Error("DELETE overrides?key=192.0.2.9: deleted false, want the prefix's override removed")
	}
	wantLimit(t, "192.0.2.5 after the delete", sequence(t, c, 1, url, "X-Forwarded-For", "192.0.2.5"), "ip", 3, 200)
}

// TestOverrideKeptAcrossReloadAndRestart: a memory zone's overrides, and
// the state of their limits, carry over a reload that keeps the zone; a
// restart of the process (same data directory) finds the overrides in
// Caddy's storage, their state starting afresh as every memory state does.
func TestOverrideKeptAcrossReloadAndRestart(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)
	url := inst.URL("/plan")

	putOverride(t, inst, "plan", "r", `{"limit": 5, "window": "1h"}`)
	putOverride(t, inst, "plan", "b", `{"action": "block"}`)
	putOverride(t, inst, "plan", "gone", `{"action": "block", "expires": "1s"}`)
	wantLimit(t, "r before the reload", sequence(t, c, 2, url, "X-Client", "r"), "plan", 5, 200, 200)

	if err := inst.Load(overridesSite(true, "\thandle /extra {\n\t\trespond \"extra\"\n\t}\n")); err != nil {
		t.Fatal(err)
	}
	rs := sequence(t, c, 4, url, "X-Client", "r")
	wantLimit(t, "r after the reload", rs, "plan", 5, 200, 200, 200, 429)
	wantCodes(t, "b after the reload", sequence(t, c, 1, url, "X-Client", "b"), 429)

	time.Sleep(time.Second) // "gone" lapses
	inst.Restart()
	url = inst.URL("/plan")
	list := listOverrides(t, inst, "plan")
	if len(list) != 2 || list[0] != (overrideView{Key: "b", Action: "block"}) || list[1] != (overrideView{Key: "r", Action: "limit", Limit: 5, Window: "1h0m0s"}) {
		t.Errorf("GET overrides after the restart: %+v, want b's and r's", list)
	}
	rs = sequence(t, c, 6, url, "X-Client", "r")
	wantLimit(t, "r after the restart", rs, "plan", 5, oks(5, 429)...)
	wantCodes(t, "b after the restart", sequence(t, c, 1, url, "X-Client", "b"), 429)
	wantLimit(t, "gone after the restart", sequence(t, c, 1, url, "X-Client", "gone"), "plan", 3, 200)
}

// TestOverrideZoneRemovedIgnoredThenBack: while a reload leaves a zone out
// of the config, its overrides apply to nothing (the same key in another
// zone keeps that zone's limit, the route the zone limited is not
// limited, and the API answers 404 for the zone); once a reload brings
// the zone back, its overrides apply again.
func TestOverrideZoneRemovedIgnoredThenBack(t *testing.T) {
	t.Parallel()
	inst, c := startOverrides(t)

	putOverride(t, inst, "plan", "k", `{"action": "block"}`)
	putOverride(t, inst, "plan", "l", `{"limit": 9}`)
	wantCodes(t, "k blocked", sequence(t, c, 1, inst.URL("/plan"), "X-Client", "k"), 429)

	if err := inst.Load(overridesSite(false, "")); err != nil {
		t.Fatal(err)
	}
	// k is blocked, so a request the old config still serves takes nothing.
	untilReloaded(t, c, inst.URL("/plan"), func(r response) error {
		if r.hasRateLimitHeaders() {
			return fmt.Errorf("served with the zone: %d %v", r.code, r.header)
		}
		return nil
	}, "X-Client", "k")
	for i, r := range sequence(t, c, 4, inst.URL("/plan"), "X-Client", "k") {
		if r.code != 200 || r.hasRateLimitHeaders() {
			t.Errorf("/plan without its zone, request %d: %d %v, want 200 and no fields", i+1, r.code, r.header)
		}
	}
	wantLimit(t, "k in zone other", sequence(t, c, 4, inst.URL("/other"), "X-Client", "k"), "other", 3, 200, 200, 200, 429)
	wantLimit(t, "l in zone other", sequence(t, c, 1, inst.URL("/other"), "X-Client", "l"), "other", 3, 200)
	var e apiError
	if code := adminCall(t, inst, http.MethodGet, overridesPath("plan", ""), &e); code != 404 || !strings.Contains(e.Error, `no zone "plan"`) {
		t.Errorf("GET overrides of a removed zone: %d %q, want 404", code, e.Error)
	}

	if err := inst.Load(overridesSite(true, "")); err != nil {
		t.Fatal(err)
	}
	// /plan is not limited by the old config, so its requests count nowhere.
	untilReloaded(t, c, inst.URL("/plan"), func(r response) error {
		if !r.hasRateLimitHeaders() {
			return fmt.Errorf("served without the zone: %d", r.code)
		}
		return nil
	}, "X-Client", "k")
	wantCodes(t, "k blocked again", sequence(t, c, 1, inst.URL("/plan"), "X-Client", "k"), 429)
	wantLimit(t, "l under its override again", sequence(t, c, 1, inst.URL("/plan"), "X-Client", "l"), "plan", 9, 200)
	if l := listOverrides(t, inst, "plan"); len(l) != 2 {
		t.Errorf("GET overrides once the zone is back: %+v, want k's and l's", l)
	}
}

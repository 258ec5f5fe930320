package e2e

// End-to-end tests of runtime overrides on redis zones: three Caddy
// processes on one redis-server, an override set or removed through one
// instance's admin API and applied by the others, through HTTP.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// fleetCall sends an override request to inst's admin API (see
// adminSend and overridesPath) and returns the status and the answer.
func fleetCall(t *testing.T, inst *caddyproc.Instance, method, zone, key, body string) (int, string) {
	t.Helper()
	var answer json.RawMessage
	code := adminSend(t, inst, method, overridesPath(zone, key), body, &answer)
	return code, string(answer)
}

// fleetSite is the Caddyfile of one fleet instance: zone "fleet" at
// /fleet, keyed by the X-Key header, 5 per hour by token bucket, on the
// Redis at addr; name is the instance's client_name on Redis, so a test
// can find its connections. zoneExtra adds options to the zone.
func fleetSite(addr, name, zoneExtra, redisExtra string) string {
	block := fmt.Sprintf("redis {\nurl redis://%s?client_name=%s\ntimeout %s\n%s\n}", addr, name, redisTimeout, redisExtra)
	return redisSite(block, redisRoute{path: "/fleet", zone: "key {http.request.header.X-Key}\nalgorithm token_bucket\nrate 5/1h\n" + zoneExtra})
}

// startFleet starts n Caddy processes on srv, named fleet-0 and on.
func startFleet(t *testing.T, srv *redistest.Server, n int, zoneExtra, redisExtra string) []*caddyproc.Instance {
	t.Helper()
	var fleet []*caddyproc.Instance
	for i := range n {
		fleet = append(fleet, caddyproc.Start(t, fleetSite(srv.Addr(), fmt.Sprintf("fleet-%d", i), zoneExtra, redisExtra)))
	}
	return fleet
}

// limitSeen sends one request for key to inst and returns its
// X-RateLimit-Limit ("" when the zone wrote none) and status.
func limitSeen(t *testing.T, c *http.Client, inst *caddyproc.Instance, key string) (string, int) {
	t.Helper()
	r := get(t, c, inst.URL("/fleet"), "X-Key", key)
	return r.header.Get("X-RateLimit-Limit"), r.code
}

// waitLimit sends requests for key to inst until its X-RateLimit-Limit is
// want, and returns how long that took from since; it fails after within.
func waitLimit(t *testing.T, c *http.Client, inst *caddyproc.Instance, key, want string, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	for {
		got, _ := limitSeen(t, c, inst, key)
		if got == want {
			return time.Since(since)
		}
		if time.Since(since) > within {
			t.Fatalf("%s: X-RateLimit-Limit for %s still %q %v after the change, want %q", inst.Addr("http"), key, got, within, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOverridesAcrossInstances: an override set through one instance is
// applied by the other two within a second, and so is its removal and a
// block; an instance started after the override applies it from its
// first request.
func TestOverridesAcrossInstances(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	fleet := startFleet(t, srv, 3, "", "")
	c := newClient(t)
	const key = "customer-1"
	for _, inst := range fleet {
		if got, _ := limitSeen(t, c, inst, key); got != "5" {
			t.Fatalf("before any override: limit %q, want 5", got)
		}
	}
	start := time.Now()
	if code, body := fleetCall(t, fleet[0], http.MethodPut, "fleet", key, `{"limit": 50}`); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	for _, inst := range fleet[1:] {
		took := waitLimit(t, c, inst, key, "50", start, time.Second)
		t.Logf("set applied on %s after %v", inst.Addr("http"), took)
	}
	late := caddyproc.Start(t, fleetSite(srv.Addr(), "fleet-late", "", ""))
	if got, _ := limitSeen(t, c, late, key); got != "50" {
		t.Errorf("an instance started after the override: first request's limit %q, want 50", got)
	}
	start = time.Now()
	if code, body := fleetCall(t, fleet[1], http.MethodDelete, "fleet", key, ""); code != http.StatusOK || !strings.Contains(body, `"deleted":true`) {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	for _, inst := range []*caddyproc.Instance{fleet[0], fleet[2], late} {
		took := waitLimit(t, c, inst, key, "5", start, time.Second)
		t.Logf("delete applied on %s after %v", inst.Addr("http"), took)
	}
	start = time.Now()
	if code, body := fleetCall(t, fleet[2], http.MethodPut, "fleet", key, `{"action": "block", "expires": "1h"}`); code != http.StatusOK {
		t.Fatalf("PUT block: %d %s", code, body)
	}
	for _, inst := range []*caddyproc.Instance{fleet[0], fleet[1], late} {
		waitLimit(t, c, inst, key, "0", start, time.Second)
		r := get(t, c, inst.URL("/fleet"), "X-Key", key)
		if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "3600" && r.header.Get("Retry-After") != "3599" {
			t.Errorf("blocked on %s: %d, Retry-After %q", inst.Addr("http"), r.code, r.header.Get("Retry-After"))
		}
	}
	var list struct {
		Overrides []map[string]any `json:"overrides"`
	}
	if code := adminCall(t, late, http.MethodGet, "/rate_limit/zones/fleet/overrides", &list); code != http.StatusOK || len(list.Overrides) != 1 || list.Overrides[0]["action"] != "block" {
		t.Errorf("list on the late instance: %d %+v", code, list)
	}
}

// TestOverridesSubscriptionCut: an instance whose subscription is killed
// (CLIENT KILL) while an override changes, and one whose message never
// comes (the set changed in Redis without one), both converge within the
// periodic refresh, here shortened to 2s by overrides_refresh.
func TestOverridesSubscriptionCut(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const refresh = 2 * time.Second
	fleet := startFleet(t, srv, 2, "", "overrides_refresh 2s")
	c := newClient(t)
	subscribed := func(name string) []map[string]string {
		return slices.DeleteFunc(clientsNamed(t, srv, func(n string) bool { return n == name }), func(f map[string]string) bool {
			return !strings.Contains(f["flags"], "P")
		})
	}
	conns := subscribed("fleet-1")
	if len(conns) == 0 {
		t.Fatal("fleet-1 holds no subscription on Redis")
	}
	for _, conn := range conns {
		id, _ := strconv.ParseInt(conn["id"], 10, 64)
		redisReply(t, srv, "CLIENT KILL", func(ctx context.Context) (int64, error) {
			return srv.Client(t).ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Result()
		})
	}
	start := time.Now()
	if code, body := fleetCall(t, fleet[0], http.MethodPut, "fleet", "cut", `{"limit": 40}`); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	took := waitLimit(t, c, fleet[1], "cut", "40", start, refresh+time.Second)
	t.Logf("applied after its subscription was cut: %v", took)
	if len(subscribed("fleet-1")) == 0 {
		t.Error("fleet-1 did not subscribe again")
	}

	// A change no message announces: the record and a new version written
	// by hand, as a writer that died between the two would leave them.
	rec := `{"action":"limit","limit":30}`
	start = time.Now()
	redisReply(t, srv, "HSET", func(ctx context.Context) (int64, error) {
		return srv.Client(t).HSet(ctx, "floodgate:overrides:fleet", "silent", rec, "", "hand-written-version").Result()
	})
	for _, inst := range fleet {
		took := waitLimit(t, c, inst, "silent", "30", start, refresh+time.Second)
		t.Logf("unannounced change applied on %s after %v", inst.Addr("http"), took)
	}
}

// TestOverridesGiveBackLeases: with local_quota, an override takes effect
// at once on an instance holding a lease for the key, and the lease's
// unspent units go back to Redis rather than wait to be spent under the
// old limit: once the override is removed, Redis counts only the
// requests admitted under the zone's limit.
func TestOverridesGiveBackLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const zoneExtra = "local_quota 0.5"
	fleet := []*caddyproc.Instance{
		caddyproc.Start(t, fleetSite(srv.Addr(), "fleet-0", zoneExtra, "")),
		caddyproc.Start(t, fleetSite(srv.Addr(), "fleet-1", zoneExtra, "")),
	}
	observer := startObserver(t, fleetSite(srv.Addr(), "observer", zoneExtra, ""))
	c := newClient(t)
	const key = "leased"
	inspect := func() keyReport {
		t.Helper()
		var st keyReport
		if code := adminCall(t, observer, http.MethodGet, "/rate_limit/zones/fleet?key="+key, &st); code != http.StatusOK {
			t.Fatalf("inspect: %d", code)
		}
		return st
	}
	// A key's first lease is of its cost, the next twice as big: two
	// requests leave a unit leased and unspent.
	for range 2 {
		if r := get(t, c, fleet[1].URL("/fleet"), "X-Key", key); r.code != http.StatusOK {
			t.Fatalf("request under the zone's limit: %d", r.code)
		}
	}
	// The lease lapses a second after it was granted, and its units then
	// go back by themselves: what the test sees of Redis before then
	// tells a give-back from a lapse.
	lapses := time.Now().Add(900 * time.Millisecond)
	if st := inspect(); st.Limit-st.Remaining <= 2 {
		t.Fatalf("after two requests, Redis counts %d taken: want a lease of more than the two admitted", st.Limit-st.Remaining)
	}
	start := time.Now()
	if code, body := fleetCall(t, fleet[0], http.MethodPut, "fleet", key, `{"limit": 2, "window": "1h"}`); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	// Until fleet-1 hears of the override, its requests are decided by
	// the zone's limit, from its lease: count them.
	underZone := 0
	for {
		r := get(t, c, fleet[1].URL("/fleet"), "X-Key", key)
		if r.header.Get("X-RateLimit-Limit") == "2" {
			break
		}
		if r.code == http.StatusOK {
			underZone++
		}
		if time.Since(start) > time.Second {
			t.Fatalf("the override is not applied on fleet-1 a second after it was set")
		}
		time.Sleep(time.Millisecond)
	}
	if r := get(t, c, fleet[1].URL("/fleet"), "X-Key", key); r.code != http.StatusOK {
		t.Fatalf("second request under the override of 2: %d", r.code)
	}
	if r := get(t, c, fleet[1].URL("/fleet"), "X-Key", key); r.code != http.StatusTooManyRequests {
		t.Fatalf("third request under the override of 2: %d, want 429 (the old lease must not be spent)", r.code)
	}
	if code, body := fleetCall(t, fleet[0], http.MethodDelete, "fleet", key, ""); code != http.StatusOK {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	for {
		st := inspect()
		taken := st.Limit - st.Remaining
		if st.Override == nil && taken == int64(2+underZone) {
			break
		}
		if time.Now().After(lapses) {
			t.Fatalf("after the override, Redis counts %d of the zone's limit taken before the lease could lapse, want %d (the requests admitted under it; override %v): the lease was not given back", taken, 2+underZone, st.Override)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOverridePropagationDelay measures, over FLOODGATE_OVERRIDE_CHANGES
// changes (default 10; BENCHMARKS.md records 100), the time from a PUT
// returning on one instance to the first request another instance decides
// under the new limit, and fails if one takes a second or more.
func TestOverridePropagationDelay(t *testing.T) {
	t.Parallel()
	n := 10
	if s := os.Getenv("FLOODGATE_OVERRIDE_CHANGES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FLOODGATE_OVERRIDE_CHANGES=%q", s)
		}
		n = v
	}
	srv := redistest.Start(t)
	fleet := startFleet(t, srv, 2, "", "")
	c := newClient(t)
	var delays []time.Duration
	for i := range n {
		want := strconv.Itoa(1000 + i)
		if code, body := fleetCall(t, fleet[i%2], http.MethodPut, "fleet", "prop", `{"limit": `+want+`}`); code != http.StatusOK {
			t.Fatalf("PUT: %d %s", code, body)
		}
		start := time.Now()
		delays = append(delays, waitLimit(t, c, fleet[1-i%2], "prop", want, start, time.Second))
	}
	slices.Sort(delays)
	t.Logf("propagation over %d changes: median %v, max %v", n, delays[len(delays)/2], delays[len(delays)-1])
}

// TestRedisOverrideRefundAfterFreshState: across two instances on one
// Redis, a request A admitted through X under override L2 (2 an hour)
// is still running when the operator, through Y, sets L1 and then L2
// again, which starts L2 afresh. B and C spend the fresh L2 through Y.
// A's response is not counted (count_response counts 5xx only), so X
// gives A's unit back, to the state it took it from: D is refused. (When
// a changed limit erased the key's state instead, A's unit went back
// into the fresh one and D passed: 3 counted requests under a limit of
// 2.)
func TestRedisOverrideRefundAfterFreshState(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	up := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") == "1" {
			arrived <- struct{}{}
			<-release
		}
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(status)
	}))
	route := redisRoute{path: "/fresh", upstream: up, zone: "key {http.request.header.X-Key}\nalgorithm fixed_window\nrate 10/1h\ncount_response {\nstatus 5xx\n}"}
	x := caddyproc.Start(t, redisSite(redisURLBlock(srv.Addr(), redisTimeout), route))
	y := caddyproc.Start(t, redisSite(redisURLBlock(srv.Addr(), redisTimeout), route))
	c := newClient(t)
	const key = "fresh-key"
	put := func(body string) {
		t.Helper()
		if code, answer := fleetCall(t, y, http.MethodPut, "fresh", key, body); code != 200 {
			t.Fatalf("PUT %s: %d %s", body, code, answer)
		}
	}
	put(`{"limit": 2, "window": "1h"}`)
	// X applies L2 (an uncounted 200 gives its unit back at once).
	waitLimit := func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := get(t, c, x.URL("/fresh?status=200"), "X-Key", key)
			if r.header.Get("X-RateLimit-Limit") == "2" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("X still decides %s by limit %q 5s after the PUT", key, r.header.Get("X-RateLimit-Limit"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitLimit()

	done := make(chan response, 1)
	go func() { done <- get(t, c, x.URL("/fresh?hold=1&status=200"), "X-Key", key) }()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("A under L2: %d", r.code)
	}
	put(`{"limit": 1, "window": "1h"}`)
	put(`{"limit": 2, "window": "1h"}`)
	for _, who := range []string{"B", "C"} {
		if r := get(t, c, y.URL("/fresh?status=500"), "X-Key", key); r.code != 500 {
			t.Fatalf("%s under the fresh L2: %d, want 500 (admitted, counted)", who, r.code)
		}
	}
	close(release)
	if r := <-done; r.code != 200 {
		t.Fatalf("A: %d", r.code)
	}
	if r := get(t, c, y.URL("/fresh?status=500"), "X-Key", key); r.code != 429 {
		t.Fatalf("D after B and C spent the fresh L2 of 2: %d, want 429 (A's uncounted unit went back into the fresh state)", r.code)
	}
	// X, once it has applied the last PUT, sees the same spent state.
	var st keyReport
	deadline := time.Now().Add(5 * time.Second)
	for adminCall(t, x, http.MethodGet, "/rate_limit/zones/fresh?key="+key, &st); st.Limit != 2 || st.Remaining != 0; adminCall(t, x, http.MethodGet, "/rate_limit/zones/fresh?key="+key, &st) {
		if time.Now().After(deadline) {
			t.Fatalf("X's inspect 5s after the last PUT: %+v, want limit 2 and none remaining", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := get(t, c, x.URL("/fresh?status=500"), "X-Key", key); r.code != 429 {
		t.Fatalf("D through X: %d, want 429", r.code)
	}
}

// TestOverridesZoneRemovedUnsubscribes: a reload that removes a redis
// zone ends that zone's subscription to its overrides' channel, once the
// old config's requests are done, while a zone both configs have keeps
// its own throughout; a reload that brings the zone back subscribes
// again and applies its overrides.
func TestOverridesZoneRemovedUnsubscribes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	block := redisURLBlock(srv.Addr(), redisTimeout)
	keep := redisRoute{path: "/keep", zone: "key {http.request.header.X-Key}\nrate 5/1h"}
	gone := redisRoute{path: "/gone", zone: "key {http.request.header.X-Key}\nrate 5/1h"}
	inst := caddyproc.Start(t, redisSite(block, keep, gone))
	subscribers := func(want map[string]int64) func() error {
		return func() error {
			var chans []string
			for z := range want {
				chans = append(chans, "floodgate:overrides:"+z)
			}
			got := redisReply(t, srv, "PUBSUB NUMSUB", func(ctx context.Context) (map[string]int64, error) {
				return srv.Client(t).PubSubNumSub(ctx, chans...).Result()
			})
			for z, n := range want {
				if got["floodgate:overrides:"+z] != n {
					return fmt.Errorf("subscribers by channel %v, want %v by zone", got, want)
				}
			}
			return nil
		}
	}
	testutil.Within(t, "both zones subscribed", 5*time.Second, subscribers(map[string]int64{"keep": 1, "gone": 1}))
	if err := inst.Load(redisSite(block, keep)); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, "the removed zone's subscription ended", 10*time.Second, subscribers(map[string]int64{"keep": 1, "gone": 0}))

	if err := inst.Load(redisSite(block, keep, gone)); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, "the zone subscribed again", 5*time.Second, subscribers(map[string]int64{"keep": 1, "gone": 1}))
	if code, body := fleetCall(t, inst, http.MethodPut, "gone", "k", `{"limit": 40}`); code != http.StatusOK {
		t.Fatalf("PUT: %d %s", code, body)
	}
	c := newClient(t)
	if r := get(t, c, inst.URL("/gone"), "X-Key", "k"); r.header.Get("X-RateLimit-Limit") != "40" {
		t.Errorf("the zone back: X-RateLimit-Limit %q, want the override's 40", r.header.Get("X-RateLimit-Limit"))
	}
}

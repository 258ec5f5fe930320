package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// shardsBlock is a redis block naming servers as shards, listed from the
// one at first on, so instances can list the same shards in different
// orders.
func shardsBlock(servers []*redistest.Server, first int, extra string) string {
	addrs := make([]string, len(servers))
	for i := range servers {
		addrs[i] = servers[(first+i)%len(servers)].Addr()
	}
	return fmt.Sprintf("redis {\nshards %s\ntimeout %s\n%s}", strings.Join(addrs, " "), redisTimeout, extra)
}

// shardOfKey is the index of the server holding the state of client key
// key (its keys carry keyHash(key) in their hash tag, as docs/redis.md
// names them), or -1 when none does; it fails t if several do.
func shardOfKey(t *testing.T, servers []*redistest.Server, key string) int {
	t.Helper()
	at := -1
	for i, s := range servers {
		keys := redisReply(t, s, "KEYS", func(ctx context.Context) ([]string, error) {
			return s.Client(t).Keys(ctx, "*{"+keyHash(key)+"}*").Result()
		})
		if len(keys) == 0 {
			continue
		}
		if at >= 0 {
			t.Fatalf("client key %s has state on shards %d and %d", key, at, i)
		}
		at = i
	}
	return at
}

// TestRedisShardsAccuracyAcrossInstances: three Caddy processes, each
// listing the same three standalone servers as shards in a different
// order, admit exactly the limit per client key for twelve keys at once,
// 60 requests per key spread over the instances against 20 per hour; every
// key's state, in every zone, is on one server, and keys spread over all
// three.
func TestRedisShardsAccuracyAcrossInstances(t *testing.T) {
	t.Parallel()
	servers := startShardServers(t, 3)
	routes := []redisRoute{
		{path: "/tb", zone: "key {query.c}\nalgorithm token_bucket\nrate 20/1h\nfail closed"},
		{path: "/fw", zone: "key {query.c}\nalgorithm fixed_window\nrate 20/1h\nfail closed"},
		{path: "/swl", zone: "key {query.c}\nalgorithm sliding_window_log\nrate 20/1h\nfail closed"},
		{path: "/swc", zone: "key {query.c}\nalgorithm sliding_window_counter\nrate 20/1h\nfail closed"},
	}
	var insts []*caddyproc.Instance
	for i := range 3 {
		insts = append(insts, caddyproc.Start(t, redisSite(shardsBlock(servers, i, ""), routes...)))
	}
	defer func() {
		if t.Failed() {
			for i, inst := range insts {
				t.Logf("caddy %d log:\n%s", i, inst.Log())
			}
		}
	}()
	c := newClient(t)

	const keys, perKey, limit = 12, 60, 20
	for _, alg := range []struct{ name, path string }{
		{"token_bucket", "/tb"},
		{"fixed_window", "/fw"},
		{"sliding_window_log", "/swl"},
		// A new key's previous window is empty: the estimate is the
		// current count exactly (see TestRedisAccuracyAcrossInstances).
		{"sliding_window_counter", "/swc"},
	} {
		// URL i is key i/3 on instance i%3: each key's requests spread
		// evenly over the instances.
		var urls []string
		for k := range keys {
			for _, inst := range insts {
				urls = append(urls, inst.URL(fmt.Sprintf("%s?c=key-%d", alg.path, k)))
			}
		}
		awayFromBoundary(t, time.Hour, 30*time.Second)
		res := burst(c, urls, keys*perKey)
		res.wantAnswered(t, alg.name)
		want := limit
		if alg.name == "token_bucket" {
			// A token comes back every 3 minutes.
			want += int(res.elapsed / (3 * time.Minute))
		}
		perKeyOK := make([]int, keys)
		for i, n := range res.okPerServer {
			perKeyOK[i/len(insts)] += n
		}
		t.Logf("%s: %d requests for %d keys over 3 instances in %v: admitted per key %v",
			alg.name, keys*perKey, keys, res.elapsed.Round(time.Millisecond), perKeyOK)
		for k, n := range perKeyOK {
			if n != want {
				t.Errorf("%s: key-%d: %d admitted, want exactly %d", alg.name, k, n, want)
			}
		}
	}

	// Each key's state is on one server, the same for every zone (the
	// hash tag is the key's), and the keys spread over all three: the
	// twelve keys above and 48 more, one request each, so that no shard
	// is left out by chance (the servers' ports, which name the shards,
	// change from run to run).
	const more = 48
	for k := keys; k < keys+more; k++ {
		if r := get(t, c, insts[k%3].URL(fmt.Sprintf("/fw?c=key-%d", k))); r.code != 200 {
			t.Fatalf("key-%d: %d, want 200", k, r.code)
		}
	}
	burstOn, moreOn := make([]int, len(servers)), make([]int, len(servers))
	for k := range keys + more {
		i := shardOfKey(t, servers, fmt.Sprintf("key-%d", k))
		switch {
		case i < 0:
			t.Fatalf("key-%d has no state on any shard", k)
		case k < keys:
			burstOn[i]++
		default:
			moreOn[i]++
		}
	}
	sizes := make([]int64, len(servers))
	for i, s := range servers {
		sizes[i] = redisDBSize(t, s)
	}
	t.Logf("client keys per shard: %v of the burst's %d, %v of %d more; Redis keys per shard %v", burstOn, keys, moreOn, more, sizes)
	for i := range servers {
		if burstOn[i]+moreOn[i] == 0 {
			t.Errorf("shard %d (%s) holds none of %d client keys: keys do not spread", i, servers[i].Addr(), keys+more)
		}
		if want := int64(burstOn[i]*len(routes) + moreOn[i]); sizes[i] != want {
			t.Errorf("shard %d holds %d Redis keys, want %d: a zone's state for each of its client keys", i, sizes[i], want)
		}
	}

	// The admin API inspects and resets a key on whichever shard it is.
	var st keyReport
	if code := adminCall(t, insts[1], http.MethodGet, "/rate_limit/zones/fw?key=key-0", &st); code != 200 || st.Remaining != 0 || st.Limit != limit {
		t.Errorf("inspect key-0: %d %+v, want limit %d with nothing left", code, st, limit)
	}
	var rs keyReset
	if code := adminCall(t, insts[2], http.MethodDelete, "/rate_limit/zones/fw?key=key-0", &rs); code != 200 || !rs.Reset {
		t.Errorf("reset key-0: %d %+v, want reset", code, rs)
	}
	// On the instance that reset it: another may still hold its own
	// cached refusal of the key (see docs/near-cache.md, the denial cache).
	r := get(t, c, insts[2].URL("/fw?c=key-0"))
	wantCodes(t, "key-0 after its reset", []response{r}, 200)
	wantRemaining(t, "key-0 after its reset", []response{r}, "fw", limit-1)
}

// TestRedisShardStopped: with one of three shards stopped, its keys get
// their zone's fail mode (fail closed: 503; fail open: 200 without the
// zone's headers), and keep getting it once its breaker opens, while keys
// on the other shards keep exact limits on two instances; the zones API
// says the store is not up. Restarted empty, the shard's keys start
// afresh and then limit exactly again.
func TestRedisShardStopped(t *testing.T) {
	t.Parallel()
	servers := startShardServers(t, 3)
	zone := "key {query.c}\nalgorithm sliding_window_log\nevents 3\nwindow 1h\nfail "
	routes := []redisRoute{{path: "/closed", zone: zone + "closed"}, {path: "/open", zone: zone + "open"}}
	// The breaker stays open 2s, so the zones API is sure to see it open
	// even on a loaded machine, when asked well inside those 2s.
	a := caddyproc.Start(t, redisSite(shardsBlock(servers, 0, "breaker_open_for 2s\n"), routes...))
	b := caddyproc.Start(t, redisSite(shardsBlock(servers, 2, "breaker_open_for 2s\n"), routes...))
	defer func() {
		if t.Failed() {
			t.Logf("caddy a log:\n%s", a.Log())
			t.Logf("caddy b log:\n%s", b.Log())
		}
	}()
	c := newClient(t)
	url := func(inst *caddyproc.Instance, path, key string) string { return inst.URL(path + "?c=" + key) }

	// One request per key and zone finds each key's shard; keep a key on
	// each.
	keyOn := make([]string, len(servers))
	for i := 0; keyOn[0] == "" || keyOn[1] == "" || keyOn[2] == ""; i++ {
		if i == 60 {
			t.Fatalf("60 keys did not cover the three shards: %q", keyOn)
		}
		k := fmt.Sprint("k", i)
		rs := []response{get(t, c, url(a, "/closed", k)), get(t, c, url(b, "/open", k))}
		wantCodes(t, k, rs, 200, 200)
		if s := shardOfKey(t, servers, k); s >= 0 && keyOn[s] == "" {
			keyOn[s] = k
		} else if s < 0 {
			t.Fatalf("%s has no state on any shard", k)
		}
	}

	dead := servers[1]
	dead.Stop()
	stopped := time.Now()
	// Past breaker_after (100ms), so the stopped shard's breaker opens,
	// and past the 1.5s in which go-redis's default Ring would have taken
	// the shard out and moved its keys onto the others.
	var zones []map[string]any
	checked := false
	for time.Since(stopped) < 2*time.Second {
		// The breakers opened past breaker_after (100ms) and stay open
		// 2s from then: look half way, not at the loop's end, which a
		// loaded machine can bring past their closing.
		if !checked && time.Since(stopped) >= 500*time.Millisecond {
			checked = true
			adminCall(t, a, http.MethodGet, "/rate_limit/zones", &zones)
			for _, z := range zones {
				if z["store_up"] != false {
					t.Errorf("zones with a shard's breaker open: %v, want store_up false", z)
				}
			}
		}
		for _, inst := range []*caddyproc.Instance{a, b} {
			r := get(t, c, url(inst, "/closed", keyOn[1]))
			wantCodes(t, "stopped shard, fail closed", []response{r}, 503)
			if got := r.header.Get("Retry-After"); got != "1" {
				t.Errorf("stopped shard, fail closed: Retry-After %q, want 1", got)
			}
			r = get(t, c, url(inst, "/open", keyOn[1]))
			wantCodes(t, "stopped shard, fail open", []response{r}, 200)
			if r.hasRateLimitHeaders() {
				t.Errorf("stopped shard, fail open: rate-limit headers %v", r.header)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The live shards' keys, one request already taken in each zone:
	// two more across the instances, then 429, exactly.
	for _, s := range []int{0, 2} {
		for _, path := range []string{"/closed", "/open"} {
			k, zn := keyOn[s], strings.TrimPrefix(path, "/")
			rs := []response{get(t, c, url(a, path, k)), get(t, c, url(b, path, k)), get(t, c, url(a, path, k))}
			what := fmt.Sprintf("%s on live shard %d, %s", k, s, zn)
			wantCodes(t, what, rs, 200, 200, 429)
			wantRemaining(t, what, rs[:2], zn, 1, 0)
			checkDenial(t, rs[2], zn, 3000, 3600)
		}
	}

	// Back, without its data. Once the breakers let decisions through
	// again (breaker_open_for after the last failure: the zones API says
	// so), the key starts afresh and limits exactly again.
	dead.Restart()
	for _, inst := range []*caddyproc.Instance{a, b} {
		deadline := time.Now().Add(10 * time.Second)
		for up := false; !up; {
			if time.Now().After(deadline) {
				t.Fatalf("zones still not up 10s after the shard returned: %v", zones)
			}
			time.Sleep(20 * time.Millisecond)
			adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &zones)
			up = len(zones) == 2 && zones[0]["store_up"] == true && zones[1]["store_up"] == true
		}
	}
	k := keyOn[1]
	rs := []response{get(t, c, url(a, "/closed", k)), get(t, c, url(b, "/closed", k)), get(t, c, url(a, "/closed", k)), get(t, c, url(b, "/closed", k))}
	wantCodes(t, "returned shard", rs, 200, 200, 200, 429)
	wantRemaining(t, "returned shard", rs[:3], "closed", 2, 1, 0)
}

// TestRedisShardClusterNodeNamed: a Cluster node listed among the shards
// is logged once, when the config loads, as an error naming the fix and
// the node, while the standalone shard's keys decide as ever.
func TestRedisShardClusterNodeNamed(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	node := redistest.StartCluster(t, 3).Masters[0]
	block := fmt.Sprintf("redis {\nshards %s %s\ntimeout %s\n}", standalone.Addr(), node.Addr(), redisTimeout)
	inst := caddyproc.Start(t, redisSite(block, redisRoute{path: "/z", zone: "key {query.c}\nrate 100/1h\nfail closed"}))
	c := newClient(t)
	// Some of 20 keys are on the standalone shard, and decide there.
	codes := map[int]int{}
	for i := range 20 {
		codes[get(t, c, inst.URL(fmt.Sprintf("/z?c=k%d", i))).code]++
	}
	if codes[200] == 0 {
		t.Errorf("20 keys over a standalone shard and a Cluster node: statuses %v, want some 200", codes)
	}
	const hint = "a server in the redis block's shards is a Redis Cluster node"
	log := inst.Log()
	if n := strings.Count(log, hint); n != 1 {
		t.Errorf("the log names the fix (%q) %d times, want once", hint, n)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, hint) && (!strings.Contains(line, `"level":"error"`) || !strings.Contains(line, node.Addr())) {
			t.Errorf("logged, but not as an error naming %s: %s", node.Addr(), line)
		}
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", log)
	}
}

// TestShardsWarmStartWithShardDown: with one shard down at startup, the
// warm start still loads every Redis zone's scripts on the live shard, as
// it does with both up (the reference here), so those zones' first
// decisions pay no NOSCRIPT round trip, which a tight timeout would turn
// into the fail mode. The bug it guards against: Preload returned on the TIME
// probe's error before loading any, and warmRedis stopped at the first
// store's error, so the other zones were not warmed either.
func TestShardsWarmStartWithShardDown(t *testing.T) {
	t.Parallel()
	routes := []redisRoute{
		{path: "/tb", zone: "key {query.c}\nalgorithm token_bucket\nrate 20/1h"},
		{path: "/fw", zone: "key {query.c}\nalgorithm fixed_window\nrate 20/1h"},
		{path: "/swl", zone: "key {query.c}\nalgorithm sliding_window_log\nrate 20/1h"},
	}
	block := func(a, b string) string {
		return "redis {\nshards " + a + " " + b + "\ntimeout " + redisTimeout + "\n}"
	}

	up1, up2 := redistest.Start(t), redistest.Start(t)
	caddyproc.Start(t, redisSite(block(up1.Addr(), up2.Addr()), routes...))
	want := infoInt(t, up1, "memory", "number_of_cached_scripts")

	live := redistest.Start(t)
	dead := testutil.ClosedAddr(t)
	inst := caddyproc.Start(t, redisSite(block(live.Addr(), dead), routes...))
	if got := infoInt(t, live, "memory", "number_of_cached_scripts"); got < want {
		t.Errorf("with the other shard down, the live shard caches %d scripts after the warm start; with both up a shard caches %d\ncaddy log:\n%s", got, want, inst.Log())
	}
}

package e2e

// Floods through a real Caddy: many distinct keys over every algorithm in
// Redis, and hostile requests (huge headers, long X-Forwarded-For chains,
// malformed tokens) next to a well-behaved client.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestRedisFloodKeysExpire: many distinct keys over every algorithm with
// short windows leave every key in Redis with a TTL, and the keys are all
// gone soon after their windows end, so Redis does not grow with the
// number of clients ever seen: two floods of new clients, one after the
// other, each leave DBSIZE at 0 once their windows end.
func TestRedisFloodKeysExpire(t *testing.T) {
	t.Parallel()
	// Three-second windows outlast a flood (about 2s here), so most keys
	// still live when they are scanned.
	const window = 3 * time.Second
	zone := func(alg string) string {
		return fmt.Sprintf("key header X-Client\nalgorithm %s\nevents 2\nwindow %v\nfail closed", alg, window)
	}
	routes := []redisRoute{
		{path: "/tb", zone: zone("token_bucket")},
		{path: "/lb", zone: zone("leaky_bucket") + "\nmax_delay 1ms"},
		{path: "/fw", zone: zone("fixed_window")},
		{path: "/swl", zone: zone("sliding_window_log")},
		{path: "/swc", zone: zone("sliding_window_counter")},
		{path: "/cc", zone: zone("concurrency")},
	}
	srv, inst := startRedisSite(t, redisTimeout, routes...)
	client := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// usedMemory is used_memory_dataset: used_memory without the
	// server's overhead and most of the clients' buffers.
	usedMemory := func() int64 { return infoInt(t, srv, "memory", "used_memory_dataset") }
	c := newClient(t)
	// flood sends two requests for each of 300 new clients per algorithm
	// (the second may be refused, or pass a bucket), from 6 goroutines.
	flood := func(round int) {
		const clients = 300
		var wg sync.WaitGroup
		var mu sync.Mutex
		var bad []string
		for _, r := range routes {
			wg.Go(func() {
				for i := range clients {
					for range 2 {
						resp, err := send(c, http.MethodGet, inst.URL(r.path), clientHeader(fmt.Sprintf("flood-%d-%d", round, i))...)
						if err != nil || (resp.code != 200 && resp.code != 429) {
							mu.Lock()
							bad = append(bad, fmt.Sprintf("%s: %d %v", r.path, resp.code, err))
							mu.Unlock()
						}
					}
				}
			})
		}
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("round %d: %d requests neither 200 nor 429: %v", round, len(bad), bad[:min(len(bad), 5)])
		}
		// Every key has a TTL. A key whose TTL ran out between SCAN and
		// PTTL answers -2 (gone), which is fine; -1 (none) is not.
		var n, noTTL int
		perZone := map[string]int{}
		iter := client.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			n++
			zone, _, _ := strings.Cut(strings.TrimPrefix(key, "floodgate:"), ":")
			perZone[zone]++
			ttl, err := client.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatalf("PTTL %s: %v", key, err)
			}
			if ttl == -1 {
				noTTL++
				if noTTL <= 5 {
					t.Errorf("key %s has no TTL", key)
				}
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatalf("SCAN: %v", err)
		}
		sent := time.Now()
		t.Logf("round %d: %d requests over %d algorithms: %d keys in Redis after (per zone %v; a concurrency key goes with its last lease), %d without a TTL",
			round, 2*clients*len(routes), len(routes), n, perZone, noTTL)
		if n < clients {
			t.Errorf("round %d: only %d keys in Redis after %d clients per zone: the flood did not reach Redis", round, n, clients)
		}
		// Everything is gone within a few seconds of the window's end
		// (Redis expires keys actively ten times a second).
		testutil.Within(t, "every key expired", window+10*time.Second, func() error {
			if n := redisDBSize(t, srv); n != 0 {
				return fmt.Errorf("DBSIZE %d", n)
			}
			return nil
		})
		t.Logf("round %d: DBSIZE 0 %v after the scan", round, time.Since(sent).Round(time.Millisecond))
	}
	before := usedMemory()
	flood(1)
	first := usedMemory()
	flood(2)
	second := usedMemory()
	// DBSIZE 0 after each flood is the check; used_memory_dataset is
	// logged only: with no key left it still moves by some 100 KB from
	// run to run (allocator pages, client buffers counted in it), the
	// size of the keys themselves, so it cannot tell growth from noise.
	t.Logf("used_memory_dataset: %d before, %d after the first flood expired, %d after the second", before, first, second)
}

// TestFloodHostileInput: requests with 64 KB key headers, 10,000-entry
// X-Forwarded-For chains through trusted proxies, and malformed bearer
// tokens are each answered within a bound, and a well-behaved client's
// requests interleaved with them see their remaining count fall by
// exactly one each time, in every zone.
//
// Caddy's own limit on a request's headers is 16 KB by default (v2.11:
// larger headers get 431 before any handler runs), so the server here
// allows 1 MB (max_header_size) for the hostile headers to reach the
// handler. The bound, 1s, is over ten times the slowest of these requests measured
// on this machine with both cores busy (about 60 ms under -race, see the
// log): a request that parsed its input quadratically, or locked out other
// clients, would blow through it.
func TestFloodHostileInput(t *testing.T) {
	t.Parallel()
	const bound = time.Second
	secret := "flood-secret-flood-secret-flood-0"
	cfg := `{
	admin {{admin}}
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	servers {
		trusted_proxies static 127.0.0.1/32 10.0.0.0/8
		trusted_proxies_strict
		max_header_size 1MB
	}
}
http://{{http}} {
	rate_limit {
		zone hostile_header {
			match {
				path /header
			}
			key header X-Big
			algorithm sliding_window_log
			rate 1000/1h
		}
		zone hostile_ip {
			match {
				path /ip
			}
			key ip
			algorithm token_bucket
			rate 1000/1h
		}
		zone hostile_jwt {
			match {
				path /jwt
			}
			key jwt_claim sub
			algorithm fixed_window
			rate 1000/1h
			missing_key deny
		}
		jwt {
			secret ` + secret + `
		}
	}
	respond "ok"
}
`
	inst := caddyproc.Start(t, cfg)
	c := newClient(t)
	good := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(secret), "", jwt.MapClaims{"sub": "good"})

	// The hostile requests: for each path, a few of each kind.
	big := strings.Repeat("A", 64<<10)
	var chain strings.Builder
	chain.WriteString("192.0.2.66")
	for i := range 9999 {
		fmt.Fprintf(&chain, ", 10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	}
	type hostile struct {
		path, what string
		headers    []string
		want       int
	}
	var attacks []hostile
	for i := range 5 {
		attacks = append(attacks,
			hostile{"/header", "64 KB header", []string{"X-Big", fmt.Sprintf("%d%s", i, big)}, 200},
			hostile{"/ip", "10,000-entry X-Forwarded-For", []string{"X-Forwarded-For", chain.String()}, 200},
			hostile{"/jwt", "64 KB garbage token", []string{"Authorization", "Bearer " + big[:60<<10]}, 429},
			hostile{"/jwt", "three garbage segments", []string{"Authorization", "Bearer e30.!!!." + fmt.Sprint(i)}, 429},
			hostile{"/jwt", "forged signature", []string{"Authorization", "Bearer " + good[:len(good)-4] + "AAAA"}, 429},
			hostile{"/jwt", "10,000 dots", []string{"Authorization", "Bearer " + strings.Repeat(".", 10000)}, 429},
		)
	}
	goodHeaders := map[string][]string{
		"/header": {"X-Big", "good"},
		"/ip":     {"X-Forwarded-For", "203.0.113.7"},
		"/jwt":    {"Authorization", "Bearer " + good},
	}
	remaining := map[string]int64{"/header": 1000, "/ip": 1000, "/jwt": 1000}
	var slowest time.Duration
	var slowestWhat string
	for _, a := range attacks {
		r := get(t, c, inst.URL(a.path), a.headers...)
		if r.took() > slowest {
			slowest, slowestWhat = r.took(), a.what
		}
		if r.took() > bound {
			t.Errorf("%s on %s: answered in %v, want within %v", a.what, a.path, r.took(), bound)
		}
		if r.code != a.want {
			t.Errorf("%s on %s: status %d, want %d", a.what, a.path, r.code, a.want)
		}
		// The well-behaved client on the same path right after.
		g := get(t, c, inst.URL(a.path), goodHeaders[a.path]...)
		remaining[a.path]--
		if g.code != 200 {
			t.Fatalf("good client on %s after %s: status %d", a.path, a.what, g.code)
		}
		if got := intHeader(t, g, "X-RateLimit-Remaining"); got != remaining[a.path] {
			t.Errorf("good client on %s after %s: remaining %d, want %d", a.path, a.what, got, remaining[a.path])
		}
	}
	// The chain's client is its one untrusted entry: the hostile requests
	// shared that key, and took 5 of its 1000.
	r := get(t, c, inst.URL("/ip"), "X-Forwarded-For", "192.0.2.66")
	if got := intHeader(t, r, "X-RateLimit-Remaining"); got != 1000-5-1 {
		t.Errorf("the chain's client 192.0.2.66: remaining %d, want %d (the chain's 5 and this one)", got, 1000-6)
	}
	t.Logf("%d hostile requests: the slowest (%s) answered in %v (bound %v)", len(attacks), slowestWhat, slowest.Round(time.Millisecond), bound)
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

package e2e

// End-to-end tests of the edges (docs/design.md, "Testing"): dry_run never
// refuses, whatever the fail mode; admin inspect and reset take the key as a
// person types it; Redis configuration errors are named at provisioning.

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestHTTPDryRunNeverRefuses: a dry_run zone lets every request through
// while its Redis is unreachable, even with `fail closed`, and says in the
// log what it would have done; a `missing_key deny` dry_run zone lets
// keyless requests through and logs them as refusals it did not make; a
// dry_run leaky bucket does not hold requests. A zone like the first but
// without dry_run answers 503, so the port really is closed.
func TestHTTPDryRunNeverRefuses(t *testing.T) {
	t.Parallel()
	addr := testutil.ClosedAddr(t)
	redis := `
			redis {
				url redis://` + addr + `
				timeout 50ms
				dial_timeout 50ms
			}`
	debugGlobals := strings.Replace(globals, "\tpersist_config off\n", "\tpersist_config off\n\tlog {\n\t\tlevel DEBUG\n\t}\n", 1)
	inst := caddyproc.Start(t, debugGlobals+`
http://{{http}} {
	handle /closed-dry {
		rate_limit {
			zone closed_dry {
				key ip
				rate 1/1h
				store redis
				fail closed
				dry_run
			}`+redis+`
		}
		respond "ok"
	}
	handle /closed {
		rate_limit {
			zone closed_real {
				key ip
				rate 1/1h
				store redis
				fail closed
			}`+redis+`
		}
		respond "ok"
	}
	handle /missing-dry {
		rate_limit {
			zone missing_dry {
				key {header.X-Key}
				missing_key deny
				rate 1/1h
				dry_run
			}
		}
		respond "ok"
	}
	handle /leaky-dry {
		rate_limit {
			zone leaky_dry {
				key ip
				algorithm leaky_bucket
				rate 1/3s
				max_delay 3s
				dry_run
			}
		}
		respond "ok"
	}
}
`)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	c := newClient(t)
	wantCodes(t, "fail closed without dry_run", sequence(t, c, 1, inst.URL("/closed")), 503)
	wantCodes(t, "fail closed, dry_run", sequence(t, c, 3, inst.URL("/closed-dry")), 200, 200, 200)
	wantCodes(t, "missing_key deny, dry_run", sequence(t, c, 3, inst.URL("/missing-dry")), 200, 200, 200)
	leaky := sequence(t, c, 2, inst.URL("/leaky-dry"))
	wantCodes(t, "leaky bucket, dry_run", leaky, 200, 200)
	if took := leaky[1].took(); took > 1500*time.Millisecond {
		t.Errorf("the second request to a dry_run leaky bucket took %v: it was held", took)
	}
	logged := func(all ...string) bool {
		for _, line := range strings.Split(inst.Log(), "\n") {
			n := 0
			for _, s := range all {
				if strings.Contains(line, s) {
					n++
				}
			}
			if n == len(all) {
				return true
			}
		}
		return false
	}
	if !logged(`"zone":"closed_dry"`, `"would_refuse":503`) {
		t.Errorf("no line with would_refuse 503 in the log of the dry_run zone's store failure")
	}
	if !logged(`"rate limit exceeded"`, `"zone":"missing_dry"`, `"dry_run":true`) {
		t.Errorf("the missing_key deny dry_run zone logged no refusal it would have made")
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

// TestRedisConfigErrorsNamedAtProvision: a redis block that Redis refuses
// for its configuration (a wrong password, none where one is required, a
// single address that is a Cluster node) is logged once, as an error
// naming the fix, when the config loads; its zones then fail as for any
// store failure: `fail closed` answers 503, and the breaker opens (the
// zones API says store_up false).
func TestRedisConfigErrorsNamedAtProvision(t *testing.T) {
	t.Parallel()
	authed := redistest.StartArgs(t, "--requirepass", "sekret")
	cluster := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		name, redis, hint string
		// breaker: every decision fails, so the breaker opens (a Cluster
		// node answers the keys of its own slots, which closes it again).
		breaker bool
	}{
		{"wrong password", "url redis://" + authed.Addr() + "\npassword wrong", "redis rejected the password: check the redis block's password/username", true},
		{"no password", "url redis://" + authed.Addr(), "redis requires a password and none was given: set the redis block's password (and username)", true},
		{"cluster node", "addresses " + cluster.Masters[0].Addr(), "is a Redis Cluster node", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var redisLines strings.Builder
			for _, l := range strings.Split(tc.redis, "\n") {
				redisLines.WriteString("\t\t\t" + l + "\n")
			}
			inst := caddyproc.Start(t, globalsWith("")+`
http://{{http}} {
	rate_limit {
		zone cfg {
			key {header.X-Client}
			rate 100/1h
			store redis
			fail closed
		}
		redis {
`+redisLines.String()+`			timeout 500ms
			breaker_after 1ms
			breaker_open_for 1m
		}
	}
	respond "ok"
}
`)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("caddy log:\n%s", inst.Log())
				}
			})
			c := newClient(t)
			if tc.breaker {
				for i := range 3 {
					wantCodes(t, "request "+strconv.Itoa(i+1), sequence(t, c, 1, inst.URL("/"), "X-Client", "k"), 503)
					time.Sleep(5 * time.Millisecond)
				}
				var zones []map[string]any
				adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &zones)
				if len(zones) != 1 || zones[0]["store_up"] != false {
					t.Errorf("zones after three failures %v apart: %v, want store_up false (the breaker open)", 5*time.Millisecond, zones)
				}
			} else {
				// Some key of a slot the node does not serve: MOVED.
				codes := map[int]int{}
				for i := range 20 {
					codes[get(t, c, inst.URL("/"), "X-Client", "k"+strconv.Itoa(i)).code]++
				}
				if codes[503] == 0 {
					t.Errorf("20 keys on one Cluster node: statuses %v, want some 503 (MOVED fails closed)", codes)
				}
			}
			log := inst.Log()
			if n := strings.Count(log, tc.hint); n != 1 {
				t.Errorf("the log names the fix (%q) %d times, want once", tc.hint, n)
			}
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, tc.hint) && !strings.Contains(line, `"level":"error"`) {
					t.Errorf("logged, but not as an error: %s", line)
				}
			}
		})
	}
}

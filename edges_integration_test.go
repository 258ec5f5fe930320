package ratelimit

// End-to-end tests of the edges design section 11 names: dry_run never
// refuses, whatever the fail mode; admin inspect and reset take the key as a
// person types it.

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestHTTPDryRunNeverRefuses: a dry_run zone lets every request through
// while its Redis is unreachable, even with `fail closed`, and says in the
// log what it would have done; a `missing_key deny` dry_run zone lets
// keyless requests through and logs them as refusals it did not make; a
// dry_run leaky bucket does not hold requests. A zone like the first but
// without dry_run answers 503, so the port really is closed.
func TestHTTPDryRunNeverRefuses(t *testing.T) {
	t.Parallel()
	addr := closedPort(t)
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
	log := inst.Log()
	for _, want := range []string{
		`"zone":"closed_dry"`,
		`"would_refuse":503`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("no %s in the log of the dry_run zone's store failure", want)
		}
	}
	if !strings.Contains(log, `"zone":"missing_dry"`) || !strings.Contains(log, `"dry_run":true`) {
		t.Errorf("the missing_key deny dry_run zone logged no refusal it would have made")
	}
}

// TestAdminKeyAsTyped: inspect and reset take a client's full IP, IPv6 or
// IPv4, and find the state of the prefix the zone groups it into, as the
// request path does; reset says whether any state existed, for a memory
// zone and a redis zone, and counts a refusal only the redis zone's local
// tier still held (its Redis state gone).
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

	// A refusal the local tier holds counts, though Redis has forgotten
	// the key.
	wantCodes(t, "red refused", sequence(t, c, 3, inst.URL("/red"), xff, "2001:db8:9::1"), 200, 200, 429)
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	reset("red", "2001:db8:9::1", true)
	reset("red", "2001:db8:9::1", false)
}

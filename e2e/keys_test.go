package e2e

// End-to-end tests of who is limited: a real Caddy (internal/caddyproc)
// decides which bucket a request falls in from its real peer address,
// X-Forwarded-For under each trusted_proxies setting, IPv4 and IPv6
// grouping, tiers chosen through Caddy's own `map`, and missing keys.
// Quotas are per hour, so nothing refills during a test however slow the
// machine is; nothing here asserts a duration.

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// TestLiveXForwardedFor: X-Forwarded-For decides the client only when the
// peer is a trusted proxy. Three servers in one Caddy: none trusted, a
// trusted loopback proxy with trusted_proxies_strict (as docs/reference.md
// recommends), and the same without strict, which shows why: it takes the
// leftmost entry, which the client writes itself.
func TestLiveXForwardedFor(t *testing.T) {
	t.Parallel()
	// One route per zone, echoing the client IP Caddy settled on, so a
	// failure says what the key was.
	route := func(zone string) string {
		return `
	rate_limit {
		zone ` + zone + ` {
			key ip
			rate 2/1h
		}
	}
	respond "{client_ip}"
`
	}
	inst := caddyproc.Start(t, globalsWith(`	servers {{http2}} {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
	}
	servers {{http3}} {
		trusted_proxies static 127.0.0.1/32
	}
`)+`
http://{{http}} {`+route("xff_untrusted")+`}
http://{{http2}} {`+route("xff_strict")+`}
http://{{http3}} {`+route("xff_leftmost")+`}
`)
	c := newClient(t)
	const xff = "X-Forwarded-For"

	t.Run("untrusted peer", func(t *testing.T) {
		t.Parallel()
		url := inst.URL("/")
		// A different spoofed client on every request: all are the
		// real peer, 127.0.0.1, and share its two requests.
		for i, want := range []int{200, 200, 429, 429} {
			spoof := fmt.Sprintf("203.0.113.%d", i+1)
			r := get(t, c, url, xff, spoof, "X-Real-IP", spoof, "Forwarded", "for="+spoof)
			if r.code != want {
				t.Errorf("request %d with X-Forwarded-For %s: status %d, want %d", i, spoof, r.code, want)
			}
			if r.code == 200 && r.body != "127.0.0.1" {
				t.Errorf("client_ip %q with no trusted proxy; want the peer, 127.0.0.1", r.body)
			}
		}
	})

	t.Run("trusted strict", func(t *testing.T) {
		t.Parallel()
		url := inst.URLOn("http2", "/")
		rs := expectCodes(t, "198.51.100.10", c, url, []int{200, 200, 429}, xff, "198.51.100.10")
		if rs[0].body != "198.51.100.10" {
			t.Errorf("client_ip %q, want 198.51.100.10 from X-Forwarded-For", rs[0].body)
		}
		expectCodes(t, "198.51.100.11", c, url, []int{200}, xff, "198.51.100.11")
		// Several entries: strict walks from the right, past trusted
		// proxies, so the client is the address the proxy appended; what
		// the client wrote to the left changes nothing.
		for i, want := range []int{200, 200, 429} {
			chain := fmt.Sprintf("203.0.113.%d, 198.51.100.20", i+1)
			r := get(t, c, url, xff, chain)
			if r.code != want {
				t.Errorf("X-Forwarded-For %q: status %d, want %d", chain, r.code, want)
			}
			if r.code == 200 && r.body != "198.51.100.20" {
				t.Errorf("X-Forwarded-For %q: client_ip %q, want 198.51.100.20", chain, r.body)
			}
		}
		// A trusted proxy in the chain is skipped, not taken as the client.
		r := get(t, c, url, xff, "198.51.100.21, 127.0.0.1")
		if r.code != 200 || r.body != "198.51.100.21" {
			t.Errorf("X-Forwarded-For through a second trusted hop: %d %q, want 200 198.51.100.21", r.code, r.body)
		}
		// The peer alone (no header) has its own bucket.
		expectCodes(t, "no X-Forwarded-For", c, url, []int{200, 200, 429})
	})

	t.Run("trusted leftmost", func(t *testing.T) {
		t.Parallel()
		url := inst.URLOn("http3", "/")
		// Without strict the leftmost entry wins: a client behind the
		// trusted proxy picks a fresh bucket with every spoofed entry.
		// This is Caddy's documented default, and why docs/reference.md
		// recommends trusted_proxies_strict.
		for i := range 4 {
			chain := fmt.Sprintf("203.0.113.%d, 198.51.100.30", i+1)
			r := get(t, c, url, xff, chain)
			if r.code != 200 || r.body != fmt.Sprintf("203.0.113.%d", i+1) {
				t.Errorf("X-Forwarded-For %q without strict: %d %q, want 200 and the leftmost entry", chain, r.code, r.body)
			}
		}
	})
}

// TestLivePrefixGrouping: addresses are grouped by ipv4_prefix and
// ipv6_prefix. The loopback peer is one address per family, so clients are
// presented through a trusted loopback proxy with X-Forwarded-For; the real
// IPv6 peer ::1 is checked on a listener of its own.
func TestLivePrefixGrouping(t *testing.T) {
	t.Parallel()
	// The harness fills only 127.0.0.1 addresses: the ::1 listener's port
	// is found here.
	port, err := testutil.FreePort("::1")
	if err != nil {
		t.Skipf("cannot listen on ::1: %v", err)
	}
	v6port := strconv.Itoa(port)
	zone := func(path, name, prefix string) string {
		return `
	handle ` + path + ` {
		rate_limit {
			zone ` + name + ` {
				key ip
				rate 2/1h
				` + prefix + `
			}
		}
		respond "{client_ip}"
	}`
	}
	inst := caddyproc.Start(t, globalsWith(`	servers {{http}} {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
	}
`)+`
http://{{http}} {`+
		zone("/v6default", "v6_default", "")+
		zone("/v6full", "v6_full", "ipv6_prefix 128")+
		zone("/v6wide", "v6_wide", "ipv6_prefix 48")+
		zone("/v4default", "v4_default", "")+
		zone("/v4group", "v4_group", "ipv4_prefix 24")+`
}
http://[::1]:`+v6port+` {
	bind ::1
	rate_limit {
		zone v6_peer {
			key ip
			rate 2/1h
		}
	}
	respond "{client_ip}"
}
`)
	c := newClient(t)
	const xff = "X-Forwarded-For"
	type step struct {
		client string
		want   int
	}
	for _, tc := range []struct {
		name, path string
		steps      []step
	}{
		{"ipv6 /64 by default", "/v6default", []step{
			{"2001:db8:1:2::a", 200},
			{"2001:db8:1:2::b", 200},
			{"2001:db8:1:2:ffff:ffff:ffff:ffff", 429}, // same /64
			{"2001:db8:1:3::a", 200},                  // next /64
			{"2001:db8:1:3::a", 200},
			{"2001:db8:1:3::1", 429},
		}},
		{"ipv6_prefix 128", "/v6full", []step{
			{"2001:db8:1:2::a", 200},
			{"2001:db8:1:2::a", 200},
			{"2001:db8:1:2::a", 429},
			{"2001:db8:1:2::b", 200}, // same /64, own address
			{"2001:db8:1:2::b", 200},
			{"2001:db8:1:2::b", 429},
		}},
		{"ipv6_prefix 48", "/v6wide", []step{
			{"2001:db8:1:2::a", 200},
			{"2001:db8:1:ffff::a", 200},
			{"2001:db8:1:7::7", 429},
			{"2001:db8:2::a", 200},
		}},
		{"ipv4 /32 by default", "/v4default", []step{
			{"198.51.100.1", 200},
			{"198.51.100.1", 200},
			{"198.51.100.1", 429},
			{"198.51.100.2", 200},
		}},
		{"ipv4_prefix 24", "/v4group", []step{
			{"198.51.100.1", 200},
			{"198.51.100.200", 200},
			{"198.51.100.77", 429},
			// The same host written as an IPv4-mapped IPv6 address is in
			// the same /24, not a way around it.
			{"::ffff:198.51.100.9", 429},
			{"198.51.101.1", 200},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := inst.URL(tc.path)
			for _, s := range tc.steps {
				if r := get(t, c, url, xff, s.client); r.code != s.want {
					t.Errorf("%s from %s: status %d, want %d (client_ip %q)", tc.path, s.client, r.code, s.want, r.body)
				}
			}
		})
	}
	t.Run("real ::1 peer", func(t *testing.T) {
		t.Parallel()
		url := "http://[::1]:" + v6port + "/"
		// The harness did not wait for this listener.
		testutil.Eventually(t, "[::1]:"+v6port+" to listen", func() error {
			conn, err := net.DialTimeout("tcp", "[::1]:"+v6port, time.Second)
			if err == nil {
				conn.Close()
			}
			return err
		})
		rs := expectCodes(t, "::1", c, url, []int{200, 200, 429})
		if rs[0].body != "::1" {
			t.Errorf("client_ip %q over IPv6 loopback, want ::1", rs[0].body)
		}
	})
}

// TestLiveTiersFromMap: the tier comes from Caddy's `map` of the API key,
// as an operator would write it; each tier has its own quota, headers and
// state, and a value no tier lists uses the zone's own limit.
func TestLiveTiersFromMap(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globalsWith("")+`
http://{{http}} {
	map {header.X-API-Key} {plan} {
		key-free  free
		key-free2 free
		key-pro   pro
		key-team  team
		default   free
	}
	rate_limit {
		zone plans {
			key header X-API-Key
			rate 5/1h
			tier {plan} {
				free 3/1h
				pro 10/1h
			}
		}
	}
	respond "{plan}"
}
`)
	c := newClient(t)
	url := inst.URL("/")
	const hdr = "X-API-Key"
	for _, tc := range []struct {
		key   string
		quota int
	}{
		{"key-free", 3},
		{"key-free2", 3},   // same tier, own key: own bucket
		{"key-unknown", 3}, // map's default: free
		{"key-pro", 10},
		{"key-team", 5}, // mapped to a plan no tier lists
	} {
		t.Run(tc.key, func(t *testing.T) {
			t.Parallel()
			want := make([]int, tc.quota+1)
			for i := range want {
				want[i] = 200
			}
			want[tc.quota] = 429
			rs := expectCodes(t, tc.key, c, url, want, hdr, tc.key)
			for i, r := range rs {
				if q := policyQuota(t, r, "plans"); q != int64(tc.quota) {
					t.Errorf("response %d: RateLimit-Policy %q, want q=%d", i, r.header.Get("RateLimit-Policy"), tc.quota)
				}
				if got := r.header.Get("X-RateLimit-Limit"); got != strconv.Itoa(tc.quota) {
					t.Errorf("response %d: X-RateLimit-Limit %q, want %d", i, got, tc.quota)
				}
				if r.code == 200 {
					if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(tc.quota-1-i); got != want {
						t.Errorf("response %d: X-RateLimit-Remaining %q, want %s", i, got, want)
					}
				}
			}
			last := rs[len(rs)-1]
			if last.header.Get("Retry-After") == "" || last.header.Get("X-RateLimit-Remaining") != "0" {
				t.Errorf("429 headers: %v", last.header)
			}
		})
	}
}

// TestLiveMissingKey: a request without the key's header, under each
// missing_key setting, end to end.
func TestLiveMissingKey(t *testing.T) {
	t.Parallel()
	route := func(mode string) string {
		return `
	handle /` + mode + ` {
		rate_limit {
			zone missing_` + mode + ` {
				key header X-API-Key
				rate 2/1h
				missing_key ` + mode + `
			}
		}
		respond "ok"
	}`
	}
	inst := caddyproc.Start(t, globalsWith("")+`
http://{{http}} {`+route("ip")+route("deny")+route("skip")+`
}
`)
	c := newClient(t)

	t.Run("ip", func(t *testing.T) {
		t.Parallel()
		url := inst.URL("/ip")
		rs := expectCodes(t, "no key", c, url, []int{200, 200, 429})
		if policyQuota(t, rs[0], "missing_ip") != 2 {
			t.Errorf("RateLimit-Policy %q", rs[0].header.Get("RateLimit-Policy"))
		}
		// The stand-in IP bucket is not the bucket of a key that equals
		// the IP, nor of any other key.
		expectCodes(t, "key 127.0.0.1", c, url, []int{200, 200, 429}, "X-API-Key", "127.0.0.1")
		expectCodes(t, "key k", c, url, []int{200, 200, 429}, "X-API-Key", "k")
		// An empty header is as missing as an absent one.
		expectCodes(t, "empty key", c, url, []int{429}, "X-API-Key", "")
	})
	t.Run("deny", func(t *testing.T) {
		t.Parallel()
		url := inst.URL("/deny")
		rs := expectCodes(t, "no key", c, url, []int{429, 429})
		if ra, err := strconv.Atoi(rs[0].header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("Retry-After %q on a missing-key denial", rs[0].header.Get("Retry-After"))
		}
		if policyQuota(t, rs[0], "missing_deny") != 2 {
			t.Errorf("RateLimit-Policy %q", rs[0].header.Get("RateLimit-Policy"))
		}
		expectCodes(t, "key k", c, url, []int{200, 200, 429}, "X-API-Key", "k")
	})
	t.Run("skip", func(t *testing.T) {
		t.Parallel()
		url := inst.URL("/skip")
		rs := expectCodes(t, "no key", c, url, []int{200, 200, 200, 200})
		for _, r := range rs {
			if v := r.header.Get("RateLimit") + r.header.Get("X-RateLimit-Limit"); v != "" {
				t.Errorf("a skipped request carries rate-limit headers (%q): no zone evaluated it", v)
			}
		}
		expectCodes(t, "key k", c, url, []int{200, 200, 429}, "X-API-Key", "k")
	})
}

package ratelimit

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// refusalSite is a rate_limit with every kind of block. A case of
// TestCaddyfileRefusalsReadAlike adds one line after a block's last
// option, so the added line's number is known.
const refusalSite = `rate_limit {
	zone api {
		rate 5/s
		store redis
		key jwt_claim sub
		count_response {
			status 401
		}
	}
	redis {
		url redis://127.0.0.1:6379
		tls {
			server_name redis.internal
		}
	}
	jwt {
		secret s
	}
	jitter 0.1
}`

// refusalBlocks are the blocks of refusalSite: how refusals name each,
// the line that opens it and the line of its last option.
var refusalBlocks = []struct {
	name       string
	open, last int
}{
	{"rate_limit", 1, 19},
	{"zone api", 2, 8},
	{"zone api: count_response", 5, 6},
	{"redis", 10, 14},
	{"redis: tls", 12, 13},
	{"jwt", 16, 17},
}

// refusalKinds are the shapes of the refusals every block words alike,
// %[1]s standing for the block, %[2]s for the option and %[3]d for the
// line.
var refusalKinds = map[string]string{
	"repeated":  `^%[1]s: option '%[2]s' specified twice, at Testfile:%[3]d$`,
	"unknown":   `^%[1]s: unknown option '%[2]s', at Testfile:%[3]d$`,
	"arguments": `^%[1]s: option '%[2]s' takes .+, at Testfile:%[3]d$`,
	"value":     `^%[1]s: option '%[2]s': .+, at Testfile:%[3]d$`,
	"block":     `^%[1]s: [^']+, at Testfile:%[3]d$`,
}

// TestCaddyfileRefusalsReadAlike: the rate_limit, zone, redis (its tls too) and jwt
// blocks, and rate_limit_status, refuse a repeated option, an unknown one,
// a missing or an extra argument and a bad value in the same words, naming the block and the
// option, at the option's line; and a block whose options contradict each
// other at the line that opens it. The adapter, which `caddy adapt` and
// the admin API's /load run, passes each refusal on as it is.
func TestCaddyfileRefusalsReadAlike(t *testing.T) {
	cases := []struct {
		block, kind, option, line string
	}{
		{"rate_limit", "repeated", "jitter", "jitter 0.2"},
		{"zone api", "repeated", "rate", "rate 6/s"},
		{"redis", "repeated", "url", "url redis://127.0.0.1:6380"},
		{"jwt", "repeated", "secret", "secret t"},
		{"redis: tls", "repeated", "server_name", "server_name other.internal"},

		{"rate_limit", "unknown", "bogus", "bogus 1"},
		{"zone api", "unknown", "bogus", "bogus 1"},
		{"redis", "unknown", "bogus", "bogus 1"},
		{"jwt", "unknown", "bogus", "bogus 1"},
		{"zone api: count_response", "unknown", "bogus", "bogus 1"},
		{"redis: tls", "unknown", "bogus", "bogus 1"},

		{"rate_limit", "arguments", "max_keys", "max_keys"},
		{"zone api", "arguments", "burst", "burst"},
		{"zone api", "arguments", "calendar", "calendar"},
		{"redis", "arguments", "timeout", "timeout"},
		{"jwt", "arguments", "issuer", "issuer"},
		{"zone api: count_response", "arguments", "status", "status"},
		{"zone api", "arguments", "response_cost", "response_cost X-Tokens keep please"},
		{"redis: tls", "arguments", "ca", "ca"},
		{"redis: tls", "arguments", "insecure_skip_verify", "insecure_skip_verify yes"},

		{"rate_limit", "arguments", "log_key", "log_key yes"},
		{"zone api", "arguments", "algorithm", "algorithm token_bucket leaky_bucket"},
		{"redis", "arguments", "db", "db 1 2"},
		{"jwt", "arguments", "from", "from header"},

		{"rate_limit", "value", "max_keys", "max_keys many"},
		{"zone api", "value", "cost", "cost many"},
		{"zone api", "value", "calendar", "calendar day"},
		{"zone api", "value", "calendar", "calendar day Nowhere/Else"},
		{"redis", "value", "pool_size", "pool_size many"},
		{"redis", "value", "overrides_refresh", "overrides_refresh 10ms"},
		{"jwt", "value", "leeway", "leeway soon"},
		{"zone api: count_response", "value", "status", "status 4x"},
		{"zone api", "value", "cost", "cost {http.request.header.X-Cost"},

		{"zone api", "block", "", "burst 3"},
		{"zone api", "block", "", "algorithm concurrency"},
		{"redis", "block", "", "addresses 127.0.0.1:6379"},
		{"redis", "block", "", "shards 127.0.0.1:6379 127.0.0.1:6380"},
		{"redis", "arguments", "shards", "shards"},
		{"jwt", "block", "", "public_key key.pem"},
		{"redis: tls", "block", "", "cert client.pem"},
	}
	for _, tc := range cases {
		t.Run(tc.block+" "+tc.kind+" "+tc.line, func(t *testing.T) {
			var open, last int
			for _, b := range refusalBlocks {
				if b.name == tc.block {
					open, last = b.open, b.last
				}
			}
			lines := strings.Split(refusalSite, "\n")
			indent := strings.Repeat("\t", strings.Count(lines[last-1], "\t"))
			input := strings.Join(append(lines[:last:last], append([]string{indent + tc.line}, lines[last:]...)...), "\n")
			at := last + 1
			if tc.kind == "block" {
				at = open
			}
			want := regexp.MustCompile(fmt.Sprintf(refusalKinds[tc.kind], regexp.QuoteMeta(tc.block), regexp.QuoteMeta(tc.option), at))

			_, err := parseDirective(t, input)
			if err == nil {
				t.Fatalf("accepted:\n%s", input)
			}
			if !want.MatchString(err.Error()) {
				t.Errorf("refusal %q does not read as %s", err, want)
			}

			// The same refusal through the adapter, one line down in a site.
			adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
			_, _, err = adapter.Adapt([]byte(":8080 {\n"+input+"\n}"), nil)
			if err == nil {
				t.Fatal("the adapter accepted it")
			}
			msg := err.Error()
			if i := strings.Index(msg, tc.block+": "); i < 0 || !strings.HasSuffix(msg, fmt.Sprintf(", at Caddyfile:%d", at+1)) {
				t.Errorf("adapter refusal %q does not name %q at Caddyfile:%d", msg, tc.block, at+1)
			}
		})
	}
	// The site itself is accepted: every refusal above is its added line's.
	if _, err := parseDirective(t, refusalSite); err != nil {
		t.Fatalf("the unchanged site is refused: %v", err)
	}
	// The rate_limit block's own check, at its line: no line added to the
	// site makes it fail, so it has an input of its own.
	want := regexp.MustCompile(fmt.Sprintf(refusalKinds["block"], "rate_limit", "", 1))
	if _, err := parseDirective(t, "rate_limit {\n\tjitter 0.1\n}"); err == nil || !want.MatchString(err.Error()) {
		t.Errorf("refusal %v does not read as %s", err, want)
	}

	// rate_limit_status takes zone names and no options: an option in a
	// block is unknown, at its line; a name given twice is refused as
	// rate_limit refuses a zone declared twice, at the directive's line.
	// Directly and through the adapter.
	for _, tc := range []struct{ input, want string }{
		{"rate_limit_status api {\n\tbogus 1\n}", fmt.Sprintf(refusalKinds["unknown"], "rate_limit_status", "bogus", 2)},
		{"rate_limit_status api {\n\tzones api\n}", fmt.Sprintf(refusalKinds["unknown"], "rate_limit_status", "zones", 2)},
		{"rate_limit_status api login api", "^rate_limit_status: zone 'api' specified twice, at Testfile:1$"},
	} {
		want := regexp.MustCompile(tc.want)
		var s StatusHandler
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err == nil || !want.MatchString(err.Error()) {
			t.Errorf("%q: refusal %v does not read as %s", tc.input, err, want)
		}
		// One line down in a site.
		adapted := regexp.MustCompile(strings.NewReplacer("^", "", "Testfile:1$", "Caddyfile:2$", "Testfile:2$", "Caddyfile:3$").Replace(tc.want))
		adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
		if _, _, err := adapter.Adapt([]byte(":8080 {\n"+tc.input+"\n}"), nil); err == nil || !adapted.MatchString(err.Error()) {
			t.Errorf("%q: adapter refusal %v does not read as %s", tc.input, err, adapted)
		}
	}
}

// TestCaddyfileRepeatableOptions: the options that may be given more than
// once (a rate_limit's zones, a zone's matchers) still may, while a zone
// name given twice is refused like a repeated option.
func TestCaddyfileRepeatableOptions(t *testing.T) {
	h, err := parseDirective(t, `rate_limit {
		zone a {
			match {
				path /a/*
			}
			match {
				method POST
			}
			rate 5/s
		}
		zone b {
			rate 5/s
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.RateLimits) != 2 || len(h.RateLimits["a"].MatcherSetsRaw) != 2 {
		t.Fatalf("parsed %d zones, zone a with %d matcher sets; want 2 and 2", len(h.RateLimits), len(h.RateLimits["a"].MatcherSetsRaw))
	}
	_, err = parseDirective(t, "rate_limit {\n zone a {\n  rate 5/s\n }\n zone a {\n  rate 5/s\n }\n}")
	if want := "rate_limit: zone 'a' specified twice, at Testfile:5"; err == nil || err.Error() != want {
		t.Errorf("refusal %v, want %q", err, want)
	}
}

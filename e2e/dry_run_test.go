package e2e

// End-to-end tests of dry_run: a dry_run zone counts and reports but never
// refuses, whatever its fail mode or missing_key, and logs what it would
// have done.

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
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

// TestHTTPDryRun: a dry-run zone counts and reports, but never refuses.
func TestHTTPDryRun(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, site(`		zone dry {
			key ip
			events 1
			window 1h
			dry_run
		}`))
	c := newClient(t)
	rs := sequence(t, c, 4, inst.URL("/"))
	wantCodes(t, "dry_run", rs, 200, 200, 200, 200)
	wantRemaining(t, "dry_run", rs, "dry", 0, 0, 0, 0)
	for i, r := range rs {
		if ra := r.header.Get("Retry-After"); ra != "" {
			t.Errorf("request %d: Retry-After %q under dry_run", i+1, ra)
		}
	}
}

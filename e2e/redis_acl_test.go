package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// aclSite is a site with one redis zone, "acl" at /acl, of 3 requests an
// hour per X-Client, failing closed, whose redis block logs in as user.
func aclSite(addr, user, password string) string {
	return redisSite(fmt.Sprintf("redis {\nurl redis://%s\nusername %s\npassword %s\ntimeout %s\n}", addr, user, password, redisTimeout),
		redisRoute{path: "/acl", zone: "key header X-Client\nalgorithm sliding_window_log\nevents 3\nwindow 1h\nfail closed"})
}

// TestRedisACLUser: a Caddy whose redis block logs in as a user created
// with exactly the ACL rule of docs/redis.md decides exactly and inspects
// and resets keys through the admin API, and the server logs no denial. A
// user without EVALSHA fails every decision (the zone fails closed) with
// Redis's error naming the command; one without SCRIPT LOAD is named once
// at the start by an error that points at that rule.
func TestRedisACLUser(t *testing.T) {
	t.Parallel()
	const password = "acl-e2e-password"
	rule := redistest.ACLRule(t, "../docs/redis.md", "floodgate", password)
	srv := redistest.Start(t)
	srv.SetUser(t, "floodgate", rule)
	c := newClient(t)

	inst := caddyproc.Start(t, aclSite(srv.Addr(), "floodgate", password))
	wantCodes(t, "as the documented ACL user", sequence(t, c, 4, inst.URL("/acl"), clientHeader("k")...), 200, 200, 200, 429)
	var st map[string]any
	if code := adminCall(t, inst, http.MethodGet, "/rate_limit/zones/acl?key=k", &st); code != 200 || st["remaining"] != 0.0 {
		t.Fatalf("inspect: %d %v", code, st)
	}
	if code := adminCall(t, inst, http.MethodDelete, "/rate_limit/zones/acl?key=k", &st); code != 200 || st["reset"] != true {
		t.Fatalf("reset: %d %v", code, st)
	}
	wantCodes(t, "after the reset", sequence(t, c, 1, inst.URL("/acl"), clientHeader("k")...), 200)
	if denied := srv.ACLDenials(t); len(denied) > 0 {
		t.Errorf("the server logged ACL denials: %v", denied)
	}
	if strings.Contains(inst.Log(), "redis user may not run") {
		t.Errorf("the warm start found a command missing:\n%s", inst.Log())
	}

	without := func(drop string) []string {
		if !slices.Contains(rule, drop) {
			t.Fatalf("the documented rule has no %s", drop)
		}
		return slices.DeleteFunc(slices.Clone(rule), func(w string) bool { return w == drop })
	}
	for _, tc := range []struct {
		drop, user string
		code       int    // of a decision
		inLog      string // a line of Caddy's log holds it
		level      string
	}{
		{"+evalsha", "no-evalsha", http.StatusServiceUnavailable, "no permissions to run the 'evalsha' command", "warn"},
		{"+script|load", "no-script-load", http.StatusOK, "no permissions to run the 'script|load' command", "error"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			srv.SetUser(t, tc.user, without(tc.drop))
			inst := caddyproc.Start(t, aclSite(srv.Addr(), tc.user, password))
			wantCodes(t, "without "+tc.drop, sequence(t, c, 1, inst.URL("/acl"), clientHeader("m")...), tc.code)
			testutil.Eventually(t, "Caddy's log naming the command", func() error {
				for line := range strings.SplitSeq(inst.Log(), "\n") {
					if strings.Contains(line, tc.inLog) && strings.Contains(line, `"level":"`+tc.level+`"`) {
						if tc.level == "error" && !strings.Contains(line, `docs/redis.md, \"Redis ACL\"`) {
							return fmt.Errorf("the error line does not point at the documented rule: %s", line)
						}
						return nil
					}
				}
				return fmt.Errorf("no %s line saying %q", tc.level, tc.inLog)
			})
			if t.Failed() {
				t.Logf("caddy log:\n%s", inst.Log())
			}
		})
	}
}

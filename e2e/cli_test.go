package e2e

// End-to-end tests of `caddy rate-limit`: the Caddy binary run as a
// subprocess against a real Caddy with memory and redis zones.

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
)

// cliRun runs `caddy rate-limit <args> --address <the instance's admin>`
// and returns what it printed and its exit status.
func cliRun(t *testing.T, inst *caddyproc.Instance, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	args = append(append([]string{"rate-limit"}, args...), "--address", inst.Addr("admin"))
	cmd := exec.Command(caddyproc.Binary(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("caddy %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// cliOK runs the command, fails the test unless it succeeded, and returns
// its standard output.
func cliOK(t *testing.T, inst *caddyproc.Instance, args ...string) string {
	t.Helper()
	out, errOut, code := cliRun(t, inst, args...)
	if code != 0 {
		t.Fatalf("caddy rate-limit %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// cliJSON runs the command with --json and decodes its output into v.
func cliJSON(t *testing.T, inst *caddyproc.Instance, v any, args ...string) {
	t.Helper()
	out := cliOK(t, inst, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("caddy rate-limit %s --json printed %q: %v", strings.Join(args, " "), out, err)
	}
}

// headerCell finds the column names of a table's header: words joined by
// single spaces ("STORE UP") are one name.
var headerCell = regexp.MustCompile(`\S+(?: \S+)*`)

// cliTable runs the command and parses its table, failing the test unless
// every cell of every row starts where its column's name does.
func cliTable(t *testing.T, inst *caddyproc.Instance, args ...string) []map[string]string {
	t.Helper()
	out := cliOK(t, inst, args...)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	cols := headerCell.FindAllStringIndex(lines[0], -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		r := map[string]string{}
		for i, c := range cols {
			start, end := c[0], len(line)
			if i+1 < len(cols) {
				end = cols[i+1][0]
			}
			if start >= len(line) || line[start] == ' ' || (start > 0 && line[start-1] != ' ') || end > len(line) {
				t.Fatalf("caddy rate-limit %s: column %d is not aligned:\n%s", strings.Join(args, " "), i, out)
			}
			r[lines[0][c[0]:c[1]]] = strings.TrimSpace(line[start:end])
		}
		rows = append(rows, r)
	}
	return rows
}

// wantRow fails the test unless exactly one row has want's cells.
func wantRow(t *testing.T, what string, rows []map[string]string, want map[string]string) {
	t.Helper()
	var found int
	for _, r := range rows {
		match := true
		for k, v := range want {
			match = match && r[k] == v
		}
		if match {
			found++
		}
	}
	if found != 1 {
		t.Errorf("%s: %d rows with %v in %v, want 1", what, found, want, rows)
	}
}

// TestCLI: every subcommand of `caddy rate-limit`, as a table and as
// --json, against memory, redis, tiered, shared and slashed zones: the
// zones listed; inspect, reset and inspect again of a key holding '/' and
// ':'; a tier's limit; the hottest keys; and the API's error message with
// a non-zero exit for an unknown zone, tier or count.
func TestCLI(t *testing.T) {
	t.Parallel()
	inst, c := startOperations(t)
	const key = "a/b:c"
	wantCodes(t, "mem", sequence(t, c, 4, inst.URL("/mem"), "X-Client", key), 200, 200, 200, 429)
	wantCodes(t, "red", sequence(t, c, 4, inst.URL("/red"), "X-Client", key), 200, 200, 200, 429)
	wantCodes(t, "gold", sequence(t, c, 2, inst.URL("/tiered"), "X-Client", "k", "X-Plan", "gold"), 200, 200)
	wantCodes(t, "shared", sequence(t, c, 1, inst.URL("/shared1"), "X-Client", "s"), 200)
	wantCodes(t, "api/v1", sequence(t, c, 1, inst.URL("/slashed"), "X-Client", key), 200)

	t.Run("zones", func(t *testing.T) {
		rows := cliTable(t, inst, "zones")
		wantRow(t, "zones", rows, map[string]string{"ZONE": "mem", "ALGORITHM": "fixed_window", "STORE": "memory", "LIMIT": "3", "WINDOW": "1h", "KEYS": "1", "STORE UP": "yes", "TIERS": "-"})
		wantRow(t, "zones", rows, map[string]string{"ZONE": "red", "STORE": "redis", "KEYS": "-", "STORE UP": "yes"})
		wantRow(t, "zones", rows, map[string]string{"ZONE": "tiered", "TIERS": "gold=5/1h"})
		wantRow(t, "zones", rows, map[string]string{"ZONE": "api/v1", "KEYS": "1"})
		// Every field, as decoded JSON: what the CLI prints is the
		// API's answer, whatever fields it has.
		var fromCLI, fromAPI []map[string]any
		cliJSON(t, inst, &fromCLI, "zones")
		adminCall(t, inst, http.MethodGet, "/rate_limit/zones", &fromAPI)
		if len(fromCLI) != 7 || !reflect.DeepEqual(fromCLI, fromAPI) {
			t.Errorf("zones --json: %+v, want the API's %+v", fromCLI, fromAPI)
		}
	})

	t.Run("inspect reset inspect", func(t *testing.T) {
		for _, zone := range []string{"mem", "red", "api/v1"} {
			left := map[string]int64{"mem": 0, "red": 0, "api/v1": 2}[zone]
			wantRow(t, zone, cliTable(t, inst, "inspect", zone, key), map[string]string{"ZONE": zone, "TIER": "-", "KEY": key, "LIMIT": "3", "REMAINING": strconv.FormatInt(left, 10)})
			var st keyReport
			cliJSON(t, inst, &st, "inspect", zone, key)
			if st.Zone != zone || st.Key != key || st.Limit != 3 || st.Remaining != left || st.ResetAfter <= 0 {
				t.Errorf("inspect %s --json: %+v", zone, st)
			}
			wantRow(t, zone, cliTable(t, inst, "reset", zone, key), map[string]string{"ZONE": zone, "TIER": "-", "KEY": key, "RESET": "true"})
			wantRow(t, zone, cliTable(t, inst, "inspect", zone, key), map[string]string{"ZONE": zone, "KEY": key, "REMAINING": "3", "RESET AFTER": "0s"})
			var reset keyReset
			cliJSON(t, inst, &reset, "reset", zone, key)
			if reset != (keyReset{Zone: zone, Key: key, Reset: false}) {
				t.Errorf("reset %s --json of a key just reset: %+v, want reset false", zone, reset)
			}
		}
		wantCodes(t, "mem after the reset", sequence(t, c, 1, inst.URL("/mem"), "X-Client", key), 200)
	})

	t.Run("tier", func(t *testing.T) {
		wantRow(t, "gold", cliTable(t, inst, "inspect", "tiered", "k", "--tier", "gold"), map[string]string{"ZONE": "tiered", "TIER": "gold", "KEY": "k", "LIMIT": "5", "REMAINING": "3"})
		wantRow(t, "own", cliTable(t, inst, "inspect", "tiered", "k"), map[string]string{"TIER": "-", "LIMIT": "3", "REMAINING": "3"})
		var reset keyReset
		cliJSON(t, inst, &reset, "reset", "tiered", "k", "--tier", "gold")
		if reset != (keyReset{Zone: "tiered", Tier: "gold", Key: "k", Reset: true}) {
			t.Errorf("reset --tier gold --json: %+v", reset)
		}
		var st keyReport
		cliJSON(t, inst, &st, "inspect", "tiered", "k", "--tier", "gold")
		if st.Tier != "gold" || st.Limit != 5 || st.Remaining != 5 {
			t.Errorf("inspect --tier gold --json after its reset: %+v", st)
		}
	})

	t.Run("two handlers", func(t *testing.T) {
		if rows := cliTable(t, inst, "inspect", "shared", "s"); len(rows) != 2 {
			t.Errorf("inspect of a zone two handlers declare: %v, want a row each", rows)
		}
		var all []keyReport
		cliJSON(t, inst, &all, "inspect", "shared", "s")
		if len(all) != 2 {
			t.Errorf("inspect --json of a zone two handlers declare: %+v, want an array of 2", all)
		}
	})

	t.Run("top", func(t *testing.T) {
		rows := cliTable(t, inst, "top", "red", "-n", "1")
		if len(rows) != 1 {
			t.Fatalf("top red -n 1: %v", rows)
		}
		wantRow(t, "top red", rows, map[string]string{"ZONE": "red", "KEY": keyHash(key), "REQUESTS": "4", "DENIED": "1"})
		var top zoneTop
		cliJSON(t, inst, &top, "top", "api/v1")
		if top.Zone != "api/v1" || len(top.Keys) != 1 || top.Keys[0] != (hotKey{Key: keyHash(key), Requests: 1}) {
			t.Errorf("top api/v1 --json: %+v", top)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, e := range []struct {
			args []string
			want string
		}{
			{[]string{"inspect", "nope", key}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"reset", "nope", key, "--json"}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"top", "nope"}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"inspect", "tiered", "k", "--tier", "silver"}, `zone \"tiered\" has no tier \"silver\" (HTTP 400)`},
			{[]string{"top", "mem", "-n", "0"}, `n must be a whole number from 1 to 1000, got \"0\" (HTTP 400)`},
			{[]string{"inspect", "mem"}, `accepts 2 arg(s), received 1`},
		} {
			out, errOut, code := cliRun(t, inst, e.args...)
			if code == 0 || out != "" || !strings.Contains(errOut, e.want) {
				t.Errorf("caddy rate-limit %s: exit %d, stdout %q, stderr %q; want a non-zero exit and %s", strings.Join(e.args, " "), code, out, errOut, e.want)
			}
		}
	})
}

// cliOverrideSite has memory zones only: api (3/1h, an exact sliding
// window), cal (100 per calendar month) and bucket (a token bucket), each
// keyed by X-Client on its own path.
func cliOverrideSite() string {
	zone := func(path, name, opts string) string {
		return `	handle ` + path + ` {
		rate_limit {
			zone ` + name + ` {
				key {header.X-Client}
` + opts + `			}
		}
		respond "ok"
	}
`
	}
	return globals + "\nhttp://{{http}} {\n" +
		zone("/api", "api", "\t\t\t\trate 3/1h\n") +
		zone("/cal", "cal", "\t\t\t\tcalendar month\n\t\t\t\tevents 100\n") +
		zone("/bucket", "bucket", "\t\t\t\talgorithm token_bucket\n\t\t\t\trate 3/1h\n\t\t\t\tburst 3\n") +
		"}\n"
}

// TestCLIOverride: `caddy rate-limit override` against a running Caddy:
// set (n/duration, a bare n, n/day in a calendar zone, --burst, --expires),
// block, exempt, list (a zone's, one key's, --json as the API answers),
// delete; requests follow each change (X-RateLimit-Limit, 429, no
// fields); and refusals, the CLI's own and the API's, print the message
// and exit non-zero with nothing on standard output.
func TestCLIOverride(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, cliOverrideSite())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})
	c := newClient(t)
	const key = "a/b:c d" // escaped as a query value
	limitOf := func(path, client string) string {
		t.Helper()
		r := get(t, c, inst.URL(path), "X-Client", client)
		return r.header.Get("X-RateLimit-Limit")
	}

	t.Run("set", func(t *testing.T) {
		if l := limitOf("/api", key); l != "3" {
			t.Fatalf("before the override: X-RateLimit-Limit %q, want 3", l)
		}
		rows := cliTable(t, inst, "override", "set", "api", key, "10/1h", "--expires", "2h")
		if len(rows) != 1 {
			t.Fatalf("set: %v", rows)
		}
		wantRow(t, "set", rows, map[string]string{"ZONE": "api", "KEY": key, "ACTION": "limit", "LIMIT": "10", "WINDOW": "1h", "BURST": "-"})
		if in := rows[0]["EXPIRES IN"]; !strings.HasPrefix(in, "1h59m") && in != "2h" {
			t.Errorf("set --expires 2h: EXPIRES IN %q", in)
		}
		if _, err := time.Parse(time.RFC3339, rows[0]["EXPIRES"]); err != nil {
			t.Errorf("EXPIRES %q: %v", rows[0]["EXPIRES"], err)
		}
		if l := limitOf("/api", key); l != "10" {
			t.Errorf("after override set 10/1h: X-RateLimit-Limit %q, want 10", l)
		}
		wantRow(t, "bare n", cliTable(t, inst, "override", "set", "api", "k2", "7"), map[string]string{"KEY": "k2", "LIMIT": "7", "WINDOW": "zone's", "EXPIRES": "never", "EXPIRES IN": "-"})
		if l := limitOf("/api", "k2"); l != "7" {
			t.Errorf("after override set 7: X-RateLimit-Limit %q, want 7", l)
		}
		wantRow(t, "calendar", cliTable(t, inst, "override", "set", "cal", "c", "500/day"), map[string]string{"ZONE": "cal", "KEY": "c", "LIMIT": "500", "WINDOW": "day"})
		if l := limitOf("/cal", "c"); l != "500" {
			t.Errorf("after override set 500/day: X-RateLimit-Limit %q, want 500", l)
		}
		wantRow(t, "burst", cliTable(t, inst, "override", "set", "bucket", "t", "6/30m", "--burst", "2"), map[string]string{"ZONE": "bucket", "LIMIT": "6", "WINDOW": "30m", "BURST": "2"})
		var v struct {
			Zone     string       `json:"zone"`
			Override overrideView `json:"override"`
		}
		cliJSON(t, inst, &v, "override", "set", "bucket", "t", "6/30m", "--burst", "2")
		if v.Zone != "bucket" || v.Override != (overrideView{Key: "t", Action: "limit", Limit: 6, Window: "30m0s", Burst: 2}) {
			t.Errorf("set --json: %+v", v)
		}
	})

	t.Run("block exempt", func(t *testing.T) {
		rows := cliTable(t, inst, "override", "block", "api", "bad", "--expires", "30s")
		wantRow(t, "block", rows, map[string]string{"ZONE": "api", "KEY": "bad", "ACTION": "block", "LIMIT": "-", "WINDOW": "-"})
		r := get(t, c, inst.URL("/api"), "X-Client", "bad")
		checkDenial(t, r, "api", 29, 30)
		wantRow(t, "exempt", cliTable(t, inst, "override", "exempt", "api", "ops"), map[string]string{"KEY": "ops", "ACTION": "exempt", "EXPIRES": "never"})
		for i, r := range sequence(t, c, 5, inst.URL("/api"), "X-Client", "ops") {
			if r.code != 200 || r.hasRateLimitHeaders() {
				t.Errorf("exempt, request %d: %d %v", i+1, r.code, r.header)
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		rows := cliTable(t, inst, "override", "list", "api")
		if len(rows) != 4 {
			t.Errorf("list api: %v, want 4 rows", rows)
		}
		for _, k := range []string{key, "k2", "bad", "ops"} {
			wantRow(t, "list api", rows, map[string]string{"ZONE": "api", "KEY": k})
		}
		wantRow(t, "list api "+key, cliTable(t, inst, "override", "list", "api", key), map[string]string{"KEY": key, "LIMIT": "10"})
		var fromCLI, fromAPI map[string]any
		cliJSON(t, inst, &fromCLI, "override", "list", "cal")
		adminCall(t, inst, http.MethodGet, "/rate_limit/zones/cal/overrides", &fromAPI)
		if !reflect.DeepEqual(fromCLI, fromAPI) || len(fromAPI["overrides"].([]any)) != 1 {
			t.Errorf("list cal --json: %v, want the API's %v", fromCLI, fromAPI)
		}
		if rows := cliTable(t, inst, "override", "list", "bucket"); len(rows) != 1 {
			t.Errorf("list bucket: %v", rows)
		}
	})

	t.Run("delete", func(t *testing.T) {
		wantRow(t, "delete", cliTable(t, inst, "override", "delete", "api", key), map[string]string{"ZONE": "api", "KEY": key, "DELETED": "true"})
		if l := limitOf("/api", key); l != "3" {
			t.Errorf("after override delete: X-RateLimit-Limit %q, want the zone's 3", l)
		}
		var removed struct {
			Deleted bool `json:"deleted"`
		}
		cliJSON(t, inst, &removed, "override", "delete", "api", key)
		if removed.Deleted {
			t.Error("delete --json of a key without an override: deleted true")
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, e := range []struct {
			args []string
			want string
		}{
			{[]string{"override", "set", "api", "k", "0/1h"}, `the limit \"0/1h\": events must be a positive integer`},
			{[]string{"override", "set", "api", "k", "ten"}, `the limit \"ten\": want <events>/<duration>`},
			{[]string{"override", "set", "api", "k", "5/1h", "--burst", "2"}, `zone \"api\" (sliding_window_log): burst applies only to token_bucket and leaky_bucket, not sliding_window_log (HTTP 400)`},
			{[]string{"override", "set", "cal", "k", "5/1h"}, `give the window as day, week or month (HTTP 400)`},
			{[]string{"override", "set", "api", "k", "5/day"}, `zone \"api\" is not a calendar zone`},
			{[]string{"override", "set", "api", "k", "5/1h", "--expires", "2020-01-01T00:00:00Z"}, `is already past (HTTP 400)`},
			{[]string{"override", "block", "api", "k", "--expires", "later"}, `expires \"later\" is neither a duration`},
			{[]string{"override", "set", "nope", "k", "5/1h"}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"override", "list", "nope", "--json"}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"override", "delete", "nope", "k"}, `no zone \"nope\" in the running config (HTTP 404)`},
			{[]string{"override", "list", "api", "nobody"}, `zone \"api\" has no override for key \"nobody\" (HTTP 404)`},
			{[]string{"override", "set", "api", "k"}, `accepts 3 arg(s), received 2`},
			{[]string{"override", "list"}, `accepts between 1 and 2 arg(s), received 0`},
			{[]string{"override", "remove", "api", "k"}, `unknown override command \"remove\": want list, set, block, exempt or delete`},
		} {
			out, errOut, code := cliRun(t, inst, e.args...)
			if code == 0 || out != "" || !strings.Contains(errOut, e.want) {
				t.Errorf("caddy rate-limit %s: exit %d, stdout %q, stderr %q; want a non-zero exit and %s", strings.Join(e.args, " "), code, out, errOut, e.want)
			}
		}
		if l := limitOf("/api", "k"); l != "3" {
			t.Errorf("after refused commands: X-RateLimit-Limit %q, want the zone's 3", l)
		}
	})
}

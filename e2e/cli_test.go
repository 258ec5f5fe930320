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
			var st keyState
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
		var st keyState
		cliJSON(t, inst, &st, "inspect", "tiered", "k", "--tier", "gold")
		if st.Tier != "gold" || st.Limit != 5 || st.Remaining != 5 {
			t.Errorf("inspect --tier gold --json after its reset: %+v", st)
		}
	})

	t.Run("two handlers", func(t *testing.T) {
		if rows := cliTable(t, inst, "inspect", "shared", "s"); len(rows) != 2 {
			t.Errorf("inspect of a zone two handlers declare: %v, want a row each", rows)
		}
		var all []keyState
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

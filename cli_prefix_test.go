package ratelimit

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// cliRows runs subcommand cmd (f its function) with argv as typed after
// it, flags included, as cobra would (its flags parsed, its arguments
// checked), and parses the table it prints: one map per row, by column.
func cliRows(t *testing.T, api *adminClient, cmd *cobra.Command, f cliFunc, argv ...string) ([]map[string]string, error) {
	t.Helper()
	if err := cmd.Flags().Parse(argv); err != nil {
		return nil, err
	}
	args := cmd.Flags().Args()
	if err := cmd.ValidateArgs(args); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := f(api, caddycmd.Flags{FlagSet: cmd.Flags()}, args, &out); err != nil {
		return nil, err
	}
	cell := regexp.MustCompile(`\s{2,}`)
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	header := cell.Split(lines[0], -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := cell.Split(line, -1)
		if len(cells) != len(header) {
			t.Fatalf("row %q has %d cells under %d columns:\n%s", line, len(cells), len(header), out.String())
		}
		r := map[string]string{}
		for i, h := range header {
			r[h] = cells[i]
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// overrideSubcommand is `caddy rate-limit override <name>`, afresh.
func overrideSubcommand(t *testing.T, name string) *cobra.Command {
	t.Helper()
	for _, c := range overrideCommand().Commands() {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no override %s", name)
	return nil
}

// TestCLIPrefixOverride: `caddy rate-limit override set|block|list|delete`
// take --prefix <p> in place of the key, against the real admin routes:
// set and block print the prefix in the PREFIX column (KEY "-"), list
// gives keys' overrides and prefixes' apart and one prefix's with
// --prefix, inspect of a key under one names it, delete removes it, and
// requests follow; a subcommand given --prefix and a key too, or missing
// its rate, is refused by its argument count.
func TestCLIPrefixOverride(t *testing.T) {
	const name = "px_cli"
	h := pxHandler(t, name, storeMemory, nil)
	api := cliAgainstAdmin(t)
	run := func(sub string, f cliFunc, argv ...string) []map[string]string {
		t.Helper()
		rows, err := cliRows(t, api, overrideSubcommand(t, sub), f, argv...)
		if err != nil {
			t.Fatalf("override %s %v: %v", sub, argv, err)
		}
		return rows
	}
	want := func(what string, rows []map[string]string, i int, cells map[string]string) {
		t.Helper()
		if i >= len(rows) {
			t.Fatalf("%s: %d rows, want row %d", what, len(rows), i)
		}
		for k, v := range cells {
			if rows[i][k] != v {
				t.Errorf("%s: row %d %s = %q, want %q (%v)", what, i, k, rows[i][k], v, rows[i])
			}
		}
	}
	want("set --prefix", run("set", cliOverrideSet, name, "--prefix", "acme:", "10/1h"), 0,
		map[string]string{"ZONE": name, "KEY": "-", "PREFIX": "acme:", "ACTION": "limit", "LIMIT": "10", "WINDOW": "1h"})
	if _, l := pxServe(h, "acme:2", ""); l != "10" {
		t.Errorf("acme:2 after set --prefix acme: 10/1h: limit %q", l)
	}
	want("set key", run("set", cliOverrideSet, name, "acme:1", "5"), 0, map[string]string{"KEY": "acme:1", "PREFIX": "-", "LIMIT": "5"})
	want("block --prefix", run("block", cliOverrideAction("block"), name, "--prefix", "bad:", "--expires", "30s"), 0,
		map[string]string{"KEY": "-", "PREFIX": "bad:", "ACTION": "block"})
	list := run("list", cliOverrideList, name)
	if len(list) != 3 {
		t.Fatalf("list: %v, want 3 rows", list)
	}
	want("list", list, 0, map[string]string{"KEY": "acme:1", "PREFIX": "-"})
	want("list", list, 1, map[string]string{"KEY": "-", "PREFIX": "acme:", "LIMIT": "10"})
	want("list", list, 2, map[string]string{"KEY": "-", "PREFIX": "bad:", "ACTION": "block"})
	one := run("list", cliOverrideList, name, "--prefix", "bad:")
	if len(one) != 1 {
		t.Fatalf("list --prefix bad:: %v", one)
	}
	want("list --prefix", one, 0, map[string]string{"PREFIX": "bad:", "ACTION": "block"})
	inspect, err := cliRows(t, api, withTier(cliCommand("inspect", "", "", 2, cliInspect)), cliInspect, name, "acme:2")
	if err != nil {
		t.Fatal(err)
	}
	want("inspect", inspect, 0, map[string]string{"KEY": "acme:2", "LIMIT": "10", "OVERRIDE": "limit (prefix acme:)"})
	want("delete --prefix", run("delete", cliOverrideDelete, name, "--prefix", "acme:"), 0,
		map[string]string{"KEY": "-", "PREFIX": "acme:", "DELETED": "true"})
	if _, l := pxServe(h, "acme:2", ""); l != "2" {
		t.Errorf("acme:2 after delete --prefix acme:: limit %q, want the zone's 2", l)
	}
	for _, c := range []struct {
		sub  string
		f    cliFunc
		argv []string
		want string
	}{
		{"set", cliOverrideSet, []string{name, "--prefix", "acme:"}, "accepts 2 arg(s), received 1"},
		{"set", cliOverrideSet, []string{name, "k", "--prefix", "acme:", "5"}, "accepts 2 arg(s), received 3"},
		{"list", cliOverrideList, []string{name, "k", "--prefix", "acme:"}, "accepts 1 arg(s), received 2"},
		{"delete", cliOverrideDelete, []string{name}, "accepts 2 arg(s), received 1"},
		{"delete", cliOverrideDelete, []string{name, "--prefix", ""}, "an empty prefix would match every key"},
	} {
		if _, err := cliRows(t, api, overrideSubcommand(t, c.sub), c.f, c.argv...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("override %s %q: %v, want %q", c.sub, c.argv, err, c.want)
		}
	}
	if got := handlerZone(t, h, name).ov.set.table().Len(); got != 2 {
		t.Errorf("after the refused commands the zone holds %d overrides, want acme:1's and bad:'s", got)
	}
}

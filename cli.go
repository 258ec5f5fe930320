package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// init registers `caddy rate-limit` with Caddy's command line, so every
// binary built with Floodgate (cmd/caddy or xcaddy) can read and reset the
// running limits through the admin API without curl.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "zones | inspect <zone> <key> | reset <zone> <key> | top <zone> | override list|set|block|exempt|delete <zone> [<key> | --prefix <p>] [<n>/<duration>] [--address <interface>] [--json]",
		Short: "Inspects, resets and overrides the rate limits of the running Caddy",
		Long: `
Reads the rate limits of the running Caddy instance through its admin API
(the routes under /rate_limit/): the zones of the running config, the state
of one key, the keys seen most in the last minute, and resets a key.

'override' lists and changes a zone's runtime overrides, which take
precedence over the key's tier and the zone's own limit without a reload:
'set' gives a key a limit of its own (<n>/<duration> such as 1000/1h, or
<n>/day, <n>/week or <n>/month in a calendar zone; a bare <n> keeps the
zone's window), 'block' refuses every request of the key, 'exempt' never
limits it, and 'delete' removes the override. --expires (a duration such as
90m, or an RFC 3339 time) makes an override lapse by itself. --prefix <p>
instead of a key names the override of every key that starts with p (keys
built like {tenant}:{user}: --prefix acme: for one tenant's users): a key's
own override wins over a prefix's, and a longer prefix over a shorter
one; each key keeps its own count under the prefix's limit. A redis zone's
overrides apply on every instance sharing its Redis; a memory zone's on
this instance only, kept across reloads and restarts.

Keys are given as the zone sees them (the evaluated key template, such as a
client IP or an API key header's value); a client's full IP address is
grouped by the zone's ipv4_prefix/ipv6_prefix, as its requests are. With
--tier, inspect and reset act on a tier's limit of the zone instead of its
own.

Since the admin endpoint is configurable, its address is taken from the
--address flag if specified; otherwise from the given --config file;
otherwise the default is assumed, as 'caddy stop' does.

Output is an aligned table; --json prints the admin API's answer as is.
`,
		CobraFunc: func(cmd *cobra.Command) {
			pf := cmd.PersistentFlags()
			pf.StringP("config", "c", "", "Configuration file to use to parse the admin address, if --address is not used")
			pf.StringP("adapter", "a", "", "Name of config adapter to apply (when --config is used)")
			pf.StringP("address", "", "", "The address to use to reach the admin API endpoint, if not the default")
			pf.Bool("json", false, "Print the admin API's JSON answer as is")
			cmd.AddCommand(
				cliCommand("zones", "", "Lists the zones of the running config", 0, cliZones),
				withTier(cliCommand("inspect", "<zone> <key> [--tier <value>]", "Shows a key's state without consuming from it", 2, cliInspect)),
				withTier(cliCommand("reset", "<zone> <key> [--tier <value>]", "Forgets a key's state, so its next request starts afresh", 2, cliReset)),
				withTop(cliCommand("top", "<zone> [-n <count>]", "Lists the keys a zone saw most in the last minute", 1, cliTop)),
				overrideCommand(),
			)
		},
	})
}

// cliFunc runs one subcommand: it asks the admin API and writes to out.
type cliFunc func(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error

// cliCommand makes a subcommand of exactly nargs arguments that runs f
// against the admin address the flags determine, routing its error through
// Caddy's own handling (logged, non-zero exit status).
func cliCommand(name, usage, short string, nargs int, f cliFunc) *cobra.Command {
	return cliCommandArgs(name, usage, short, cobra.ExactArgs(nargs), f)
}

// cliCommandArgs is cliCommand for a subcommand whose arguments args
// checks, such as override list's optional key.
func cliCommandArgs(name, usage, short string, args cobra.PositionalArgs, f cliFunc) *cobra.Command {
	return &cobra.Command{
		Use:   strings.TrimSpace(name + " " + usage),
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			run := func(fl caddycmd.Flags) (int, error) {
				addr, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
				if err != nil {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("couldn't determine admin API address: %w", err)
				}
				api := &adminClient{addr: addr, raw: fl.Bool("json")}
				if err := f(api, fl, args, cmd.OutOrStdout()); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				return caddy.ExitCodeSuccess, nil
			}
			return caddycmd.WrapCommandFuncForCobra(run)(cmd, args)
		},
	}
}

// withTier adds --tier to inspect and reset.
func withTier(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().String("tier", "", "The tier value whose limit to act on, instead of the zone's own")
	return cmd
}

// withTop adds -n to top.
func withTop(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().IntP("n", "n", 10, "How many keys to list (1 to 1000)")
	return cmd
}

// adminClient asks the admin API's rate_limit routes.
type adminClient struct {
	addr string
	// raw prints the API's answers as they are (--json) instead of tables.
	raw bool
}

// call sends method to the admin API at uri and returns the answer's body.
// An error answer is reported by the message and status the API gave.
func (c *adminClient) call(method, uri string) ([]byte, error) {
	return c.callWith(method, uri, nil)
}

// callWith is call with a JSON request body (none when nil).
func (c *adminClient) callWith(method, uri string, body []byte) ([]byte, error) {
	resp, err := c.send(method, uri, body)
	if err != nil {
		return nil, fmt.Errorf("asking the admin API at %s: %w", c.addr, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s %s: %w", method, uri, err)
	}
	if resp.StatusCode >= 400 {
		return nil, answerError(resp.StatusCode, answer)
	}
	return answer, nil
}

// maxAnswer bounds what the CLI reads of one answer; a top list of 1000
// keys is far smaller.
const maxAnswer = 8 << 20

// send makes one request of the admin API. It is caddycmd.AdminAPIRequest
// without its error text: that function folds an error answer into a
// string, and the CLI wants the status and body apart. Like it, send dials
// the admin address's own network (tcp or a unix socket) and names a
// loopback origin, which the admin endpoint requires.
func (c *adminClient) send(method, uri string, body []byte) (*http.Response, error) {
	addr, err := caddy.ParseNetworkAddress(c.addr)
	if err != nil {
		return nil, fmt.Errorf("admin address %q: %w", c.addr, err)
	}
	if addr.PortRangeSize() > 1 {
		return nil, fmt.Errorf("admin address %q is a port range, not one address", c.addr)
	}
	dial := addr.JoinHostPort(0)
	base, origin := "http://"+dial, "http://"+dial
	if addr.IsUnixNetwork() {
		// A socket's path may carry its permission bits: "path|0220". The
		// host of the URL is then a stand-in, and no origin is named.
		dial, _, _ = strings.Cut(addr.Host, "|")
		base, origin = "http://127.0.0.1", ""
	}
	var payload io.Reader
	if body != nil {
		payload = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, base+uri, payload)
	if err != nil {
		return nil, fmt.Errorf("making the request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	client := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, addr.Network, dial)
		},
		DisableKeepAlives: true,
	}}
	return client.Do(req)
}

// answerError is an error answer of the admin API as the CLI shows it: the
// message of the caddy.APIError the API wrote, and the status. A body that
// is not such an error (a proxy's page, say) is shown as it is.
func answerError(status int, body []byte) error {
	var apiErr caddy.APIError
	if json.Unmarshal(body, &apiErr) == nil && apiErr.Message != "" {
		return fmt.Errorf("%s (HTTP %d)", apiErr.Message, status)
	}
	return fmt.Errorf("the admin API answered HTTP %d: %s", status, bytes.TrimSpace(body))
}

// zonePath is the admin API path of a zone, its name escaped as one path
// segment so names holding '/' reach the right zone.
func zonePath(zone string) string {
	return adminPrefix + "zones/" + url.PathEscape(zone)
}

// keyURI is the admin API URI of a key of a zone, and of a tier's limit.
func keyURI(fl caddycmd.Flags, args []string) string {
	q := url.Values{"key": {args[1]}}
	if tier := fl.String("tier"); tier != "" {
		q.Set("tier", tier)
	}
	return zonePath(args[0]) + "?" + q.Encode()
}

// oneOrAll decodes an answer that is one object, or an array of them when
// two handlers declare the zone name.
func oneOrAll[T any](body []byte) ([]T, error) {
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		var all []T
		if err := json.Unmarshal(b, &all); err != nil {
			return nil, fmt.Errorf("decoding the admin API's answer: %w", err)
		}
		return all, nil
	}
	var one T
	if err := json.Unmarshal(body, &one); err != nil {
		return nil, fmt.Errorf("decoding the admin API's answer: %w", err)
	}
	return []T{one}, nil
}

// show asks the admin API and prints its answer to out: as is with
// --json, else as a table of header and the rows cells makes of each
// element of the answer, which is one T or an array of them.
func show[T any](api *adminClient, out io.Writer, method, uri string, header []string, cells func(T) [][]string) error {
	return showWith(api, out, method, uri, nil, header, cells)
}

// showWith is show with a JSON request body (none when nil).
func showWith[T any](api *adminClient, out io.Writer, method, uri string, reqBody []byte, header []string, cells func(T) [][]string) error {
	body, err := api.callWith(method, uri, reqBody)
	if err != nil {
		return err
	}
	if api.raw {
		_, err := out.Write(body)
		return err
	}
	all, err := oneOrAll[T](body)
	if err != nil {
		return err
	}
	// The table is aligned in memory, where writing cannot fail, and
	// written out whole.
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, v := range all {
		for _, r := range cells(v) {
			for i := range r {
				r[i] = printable(r[i])
			}
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = out.Write(table.Bytes())
	return err
}

// printable is a table cell as a terminal may show it: a cell holding a
// control character, a tab, a newline or invalid UTF-8 (a client's key,
// under log_key, is whatever the client sent) is written Go-escaped, so it
// can neither drive the operator's terminal nor split into forged columns
// or rows.
func printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

// orDash shows an empty cell as "-", so columns stay readable.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// seconds shows a duration in seconds as Go writes durations, without
// trailing zero units: 3600 is "1h", 90 is "1m30s".
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
	if strings.HasSuffix(d, "m0s") {
		d = strings.TrimSuffix(d, "0s")
	}
	if strings.HasSuffix(d, "h0m") {
		d = strings.TrimSuffix(d, "0m")
	}
	return d
}

func cliZones(api *adminClient, _ caddycmd.Flags, _ []string, out io.Writer) error {
	header := []string{"ZONE", "ALGORITHM", "STORE", "LIMIT", "WINDOW", "KEYS", "STORE UP", "GLOBAL", "TIERS"}
	return show(api, out, http.MethodGet, adminPrefix+"zones", header, func(z zoneInfo) [][]string {
		keys, up := "-", "no"
		if z.Keys != nil {
			keys = strconv.Itoa(*z.Keys)
		}
		if z.StoreUp {
			up = "yes"
		}
		var tiers []string
		for _, t := range z.Tiers {
			tiers = append(tiers, fmt.Sprintf("%s=%d/%s", t.Value, t.Limit, seconds(t.Window)))
		}
		return [][]string{{z.Zone, z.Algorithm, z.Store, strconv.FormatInt(z.Limit, 10), seconds(z.Window), keys, up, orDash(z.Global), orDash(strings.Join(tiers, ","))}}
	})
}

func cliInspect(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	header := []string{"ZONE", "TIER", "KEY", "LIMIT", "REMAINING", "RESET AFTER", "OVERRIDE", "REGION", "GLOBAL REMAINING"}
	return show(api, out, http.MethodGet, keyURI(fl, args), header, func(s keyReport) [][]string {
		limit, remaining, reset := strconv.FormatInt(s.Limit, 10), strconv.FormatInt(s.Remaining, 10), seconds(s.ResetAfter)
		override := "-"
		if o := s.Override; o != nil {
			override = o.Action
			if o.Prefix != "" {
				override += " (prefix " + o.Prefix + ")"
			}
			if o.Expires != "" {
				override += " until " + o.Expires
			}
			if o.Action == "exempt" {
				// Never limited: no numbers to show.
				limit, remaining, reset = "-", "-", "-"
			}
		}
		region, global := "-", "-"
		if g := s.Region; g != nil {
			// The units this region holds and for how long, and global's
			// own count.
			region = strconv.FormatInt(g.Units, 10) + " for " + seconds(g.LapsesAfter)
			if g.DeniedFor > 0 {
				region += ", refused for " + seconds(g.DeniedFor)
			}
			global = strconv.FormatInt(g.GlobalRemaining, 10)
		}
		return [][]string{{s.Zone, orDash(s.Tier), s.Key, limit, remaining, reset, override, region, global}}
	})
}

func cliReset(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	header := []string{"ZONE", "TIER", "KEY", "RESET"}
	return show(api, out, http.MethodDelete, keyURI(fl, args), header, func(r keyReset) [][]string {
		return [][]string{{r.Zone, orDash(r.Tier), r.Key, strconv.FormatBool(r.Reset)}}
	})
}

func cliTop(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	uri := zonePath(args[0]) + "/top?n=" + strconv.Itoa(fl.Int("n"))
	return show(api, out, http.MethodGet, uri, []string{"ZONE", "KEY", "REQUESTS", "DENIED"}, func(t zoneTop) [][]string {
		var rows [][]string
		for _, k := range t.Keys {
			rows = append(rows, []string{t.Zone, k.Key, strconv.FormatUint(k.Requests, 10), strconv.FormatUint(k.Denied, 10)})
		}
		return rows
	})
}

// overrideCommand is `caddy rate-limit override`: a zone's runtime
// overrides, listed and changed through the admin API's /overrides routes.
func overrideCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "override list|set|block|exempt|delete <zone> [<key> | --prefix <p>] [<n>/<duration>]",
		Short: "Lists and changes a zone's runtime overrides: one key's (or a prefix's keys') own limit, a block or an exemption",
		// A mistyped subcommand fails, rather than printing the help and
		// exiting 0 as a command without a Run does.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return caddycmd.WrapCommandFuncForCobra(func(caddycmd.Flags) (int, error) {
				return caddy.ExitCodeFailedStartup, fmt.Errorf("unknown override command %q: want list, set, block, exempt or delete", args[0])
			})(cmd, args)
		},
	}
	cmd.AddCommand(
		withPrefix(cliCommandArgs("list", "<zone> [<key> | --prefix <p>]", "Lists a zone's overrides, or one key's or prefix's", cobra.RangeArgs(1, 2), cliOverrideList), 0),
		withPrefix(withOverrideSet(cliCommand("set", "<zone> <key>|--prefix <p> <n>/<duration> [--burst <n>] [--expires <duration>|<RFC 3339>]", "Gives a key, or every key under a prefix, a limit of its own, such as 1000/1h", 3, cliOverrideSet)), 1),
		withPrefix(withExpires(cliCommand("block", "<zone> <key>|--prefix <p> [--expires <duration>|<RFC 3339>]", "Refuses every request of a key, or of every key under a prefix (429)", 2, cliOverrideAction("block"))), 0),
		withPrefix(withExpires(cliCommand("exempt", "<zone> <key>|--prefix <p> [--expires <duration>|<RFC 3339>]", "Never limits a key, or any key under a prefix", 2, cliOverrideAction("exempt"))), 0),
		withPrefix(cliCommand("delete", "<zone> <key>|--prefix <p>", "Removes a key's or a prefix's override: its keys' tier or the zone decides them again", 2, cliOverrideDelete), 0),
	)
	return cmd
}

// withPrefix adds --prefix to an override subcommand, which then names
// the override of every key that starts with it instead of one key's:
// the <key> argument is left out, so the subcommand takes <zone> and
// rest more arguments (list: <zone> alone).
func withPrefix(cmd *cobra.Command, rest int) *cobra.Command {
	cmd.Flags().String("prefix", "", "The override of every key that starts with this, instead of one key's (a key's own override still wins, and a longer prefix over a shorter one)")
	withKey := cmd.Args
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if cmd.Flags().Changed("prefix") {
			return cobra.ExactArgs(1+rest)(cmd, args)
		}
		return withKey(cmd, args)
	}
	return cmd
}

// overrideArgs splits an override subcommand's arguments into the URI of
// the override they name (a key's, or with --prefix a prefix's; the
// zone's overrides when they name neither) and the arguments after it.
func overrideArgs(fl caddycmd.Flags, args []string) (uri string, rest []string) {
	zone := args[0]
	switch {
	case fl.Changed("prefix"):
		return overridesURI(zone, "prefix", fl.String("prefix")), args[1:]
	case len(args) > 1:
		return overridesURI(zone, "key", args[1]), args[2:]
	}
	return overridesURI(zone, "", ""), nil
}

// withExpires adds --expires to the subcommands that set an override.
func withExpires(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().String("expires", "", "When the override lapses: a duration from now (90m, 2d) or an RFC 3339 time; never if not given")
	return cmd
}

// withOverrideSet adds --burst and --expires to override set.
func withOverrideSet(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().Int64("burst", 0, "The bucket's capacity (token_bucket and leaky_bucket zones); the zone's if not given")
	return withExpires(cmd)
}

// overridesURI is the admin API URI of a zone's overrides, and of one
// key's or prefix's when param ("key" or "prefix") is not "".
func overridesURI(zone, param, value string) string {
	uri := zonePath(zone) + "/overrides"
	if param != "" {
		uri += "?" + url.Values{param: {value}}.Encode()
	}
	return uri
}

// overrideHeader heads the tables of overrides: each row has a KEY or a
// PREFIX, the other "-".
var overrideHeader = []string{"ZONE", "KEY", "PREFIX", "ACTION", "LIMIT", "WINDOW", "BURST", "EXPIRES", "EXPIRES IN"}

// overrideRow is one override as a table shows it: a window or burst the
// override leaves to the zone reads "zone's" and "-", an action without a
// quota "-", an override without expiry "never", the time left whole
// seconds.
func overrideRow(zone string, v overrideView) []string {
	limit, window, burst := "-", "-", "-"
	if v.Action == "limit" {
		limit, window = strconv.FormatInt(v.Limit, 10), "zone's"
		if v.Window != "" {
			window = v.Window
			if d, err := time.ParseDuration(v.Window); err == nil {
				window = seconds(d.Seconds())
			}
		}
		if v.Burst != 0 {
			burst = strconv.FormatInt(v.Burst, 10)
		}
	}
	expires, in := "never", "-"
	if v.Expires != "" {
		// Whole seconds, rounded up as Retry-After is.
		expires, in = v.Expires, seconds(math.Ceil(v.ExpiresIn))
		if t, err := time.Parse(time.RFC3339Nano, v.Expires); err == nil {
			expires = t.UTC().Format(time.RFC3339)
		}
	}
	return []string{zone, orDash(v.Key), orDash(v.Prefix), v.Action, limit, window, burst, expires, in}
}

// showOverride shows the answer of a PUT, or of a GET of one key: the
// override, for each distinct set of the zone's overrides.
func showOverride(api *adminClient, out io.Writer, method, uri string, body []byte) error {
	return showWith(api, out, method, uri, body, overrideHeader, func(o zoneOverride) [][]string {
		return [][]string{overrideRow(o.Zone, o.Override)}
	})
}

func cliOverrideList(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	uri, _ := overrideArgs(fl, args)
	if len(args) == 2 || fl.Changed("prefix") {
		return showOverride(api, out, http.MethodGet, uri, nil)
	}
	return show(api, out, http.MethodGet, uri, overrideHeader, func(zo zoneOverrides) [][]string {
		rows := make([][]string, 0, len(zo.Overrides))
		for _, v := range zo.Overrides {
			rows = append(rows, overrideRow(zo.Zone, v))
		}
		return rows
	})
}

func cliOverrideSet(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	uri, rest := overrideArgs(fl, args)
	body, err := overrideSetBody(rest[0], fl)
	if err != nil {
		return err
	}
	return showOverride(api, out, http.MethodPut, uri, body)
}

// overrideSetBody is the PUT body of `override set`: its limit written as
// a Caddyfile tier's (<n>/<duration>, or <n>/day|week|month), or a bare
// <n> that keeps the zone's window, with --burst and --expires.
func overrideSetBody(rate string, fl caddycmd.Flags) ([]byte, error) {
	var b overrideBody
	if n, err := strconv.ParseInt(rate, 10, 64); err == nil {
		if n <= 0 {
			return nil, fmt.Errorf("the limit must be a positive integer, got %q", rate)
		}
		b.Limit = &n
	} else {
		tl, err := parseTierRate(rate)
		if err != nil {
			return nil, fmt.Errorf("the limit %q: %w", rate, err)
		}
		b.Limit, b.Window = &tl.MaxEvents, tl.Period
		if tl.Period == "" {
			b.Window = time.Duration(tl.Window).String()
		}
	}
	if fl.Changed("burst") {
		burst, err := fl.GetInt64("burst")
		if err != nil {
			return nil, fmt.Errorf("--burst: %w", err)
		}
		b.Burst = &burst
	}
	b.Expires = fl.String("expires")
	return b.marshal()
}

// marshal writes b as the CLI's PUT body, leaving out what the command
// does not set.
func (b overrideBody) marshal() ([]byte, error) {
	body, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("writing the override: %w", err)
	}
	return body, nil
}

// cliOverrideAction is `override block` or `override exempt`.
func cliOverrideAction(action string) cliFunc {
	return func(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
		body, err := overrideBody{Action: action, Expires: fl.String("expires")}.marshal()
		if err != nil {
			return err
		}
		uri, _ := overrideArgs(fl, args)
		return showOverride(api, out, http.MethodPut, uri, body)
	}
}

func cliOverrideDelete(api *adminClient, fl caddycmd.Flags, args []string, out io.Writer) error {
	uri, _ := overrideArgs(fl, args)
	return show(api, out, http.MethodDelete, uri, []string{"ZONE", "KEY", "PREFIX", "DELETED"}, func(r overrideRemoval) [][]string {
		return [][]string{{r.Zone, orDash(r.Key), orDash(r.Prefix), strconv.FormatBool(r.Deleted)}}
	})
}

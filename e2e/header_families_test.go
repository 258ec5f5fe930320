package e2e

// The header families (`headers x-ratelimit | ietf | draft-7 | draft-6 |
// none`) as clients read them: parsed as the drafts define them, and by
// npm's ratelimit-header-parser, the JavaScript parser express-rate-limit's
// authors publish, installed from npm the way the suite installs servers.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
)

// familySite is a site on listener with headers (none when "") and two
// zones, named after the listener since zones of one name and limit share
// their counters: "bucket_*" refills a token each 30 minutes and holds two
// (RateLimit-Policy 2;w=3600), so its values hold still for the test, and
// "hourly_*", a hundred an hour, has more left, so the single-valued
// families report the bucket.
func familySite(listener, headers string) string {
	opt := ""
	if headers != "" {
		opt = "\t\theaders " + headers + "\n"
	}
	return fmt.Sprintf(`http://{{%[1]s}} {
	rate_limit {
		zone bucket_%[1]s {
			key ip
			algorithm token_bucket
			rate 2/1h
		}
		zone hourly_%[1]s {
			key ip
			algorithm fixed_window
			events 100
			window 1h
		}
%[2]s	}
	respond "ok"
}
`, listener, opt)
}

// draftFields are the fields of every family, to check which a response
// carries.
var draftFields = []string{
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
	"RateLimit", "RateLimit-Policy",
	"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
}

// onlyFields fails unless r carries exactly the rate-limit fields present.
func onlyFields(t *testing.T, what string, r response, present ...string) {
	t.Helper()
	for _, f := range draftFields {
		if has := r.header.Get(f) != ""; has != slices.Contains(present, f) {
			t.Errorf("%s: %s present %v (%q), want %v", what, f, has, r.header.Get(f), !has)
		}
	}
}

// draftState is what the draft families report: limit, remaining, reset.
type draftState struct{ limit, remaining, reset int64 }

// draft7 reads draft 7's RateLimit, which must be an RFC 9651 Dictionary of
// exactly limit, remaining and reset, each an Integer.
func draft7(t *testing.T, r response) draftState {
	t.Helper()
	v := r.header.Values("RateLimit")
	if len(v) != 1 {
		t.Fatalf("RateLimit: want one field line, got %q", v)
	}
	members, err := parseSFDictionary(v[0])
	if err != nil {
		t.Fatalf("RateLimit: %q does not parse as an RFC 9651 Dictionary: %v", v[0], err)
	}
	var keys []string
	got := map[string]int64{}
	for _, m := range members {
		n, ok := m.item.value.(int64)
		if !ok || len(m.item.params) > 0 || n < 0 {
			t.Fatalf("RateLimit: %s is %#v, want a non-negative Integer without parameters", m.key, m.item)
		}
		keys, got[m.key] = append(keys, m.key), n
	}
	if !slices.Equal(keys, []string{"limit", "remaining", "reset"}) {
		t.Fatalf("RateLimit: %q has keys %v, want limit, remaining, reset", v[0], keys)
	}
	return draftState{got["limit"], got["remaining"], got["reset"]}
}

// draft6 reads draft 6's RateLimit-Limit, -Remaining and -Reset, each an
// RFC 9651 Integer Item.
func draft6(t *testing.T, r response) draftState {
	t.Helper()
	var out [3]int64
	for i, f := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
		v := r.header.Values(f)
		if len(v) != 1 {
			t.Fatalf("%s: want one field line, got %q", f, v)
		}
		items, err := parseSFList(v[0])
		if err != nil || len(items) != 1 || len(items[0].params) > 0 {
			t.Fatalf("%s: %q is not one Integer Item (%v)", f, v[0], err)
		}
		n, ok := items[0].value.(int64)
		if !ok || n < 0 {
			t.Fatalf("%s: %q is not a non-negative Integer", f, v[0])
		}
		out[i] = n
	}
	return draftState{out[0], out[1], out[2]}
}

// wantDraftPolicy checks the drafts' RateLimit-Policy: one quota policy,
// the reported zone's, an Integer with its window as w.
func wantDraftPolicy(t *testing.T, what string, r response, quota, window int64) {
	t.Helper()
	v := r.header.Values("RateLimit-Policy")
	items, err := parseSFList(strings.Join(v, ", "))
	if len(v) != 1 || err != nil || len(items) != 1 {
		t.Fatalf("%s: RateLimit-Policy %q, want one quota policy (%v)", what, v, err)
	}
	q, ok := items[0].value.(int64)
	if !ok || q != quota || len(items[0].params) != 1 || items[0].params[0] != (sfParam{"w", window}) {
		t.Errorf("%s: RateLimit-Policy %q, want %d;w=%d", what, v[0], quota, window)
	}
}

// wantBucketSequence checks what the draft families report of the
// bucket, the zone with the least left, over two admitted requests and a
// refusal: limit 2; remaining 1, 0, 0; reset a token's refill (1800s),
// then the time to fill both (3600s), then Retry-After.
func wantBucketSequence(t *testing.T, what string, rs []response, read func(*testing.T, response) draftState) {
	t.Helper()
	wantCodes(t, what, rs, 200, 200, 429)
	for i, want := range []draftState{{2, 1, 1800}, {2, 0, 3600}, {2, 0, intHeader(t, rs[2], "Retry-After")}} {
		got := read(t, rs[i])
		// Seconds round up: a reset may read a second less only when a
		// whole second passed since the bucket last changed.
		if got.limit != want.limit || got.remaining != want.remaining || got.reset < want.reset-1 || got.reset > want.reset {
			t.Errorf("%s: response %d reports %+v, want %+v", what, i+1, got, want)
		}
		wantDraftPolicy(t, what, rs[i], 2, 3600)
	}
	if retry := intHeader(t, rs[2], "Retry-After"); retry < 1790 || retry > 1800 {
		t.Errorf("%s: Retry-After %d, want a token's refill, 1800s", what, retry)
	}
}

// TestHTTPHeaderFamilies: draft-7 and draft-6, alone, with x-ratelimit, and
// loaded from JSON (a list, or one name as a string as configs were
// written before lists), in a real Caddy: each response carries exactly
// its families' fields, which parse as the drafts define them and report
// the zone with the least left, its reset agreeing with Retry-After on a
// refusal.
func TestHTTPHeaderFamilies(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globals+
		familySite("http", "draft-7")+
		familySite("http2", "draft-6")+
		familySite("http3", "x-ratelimit draft-7")+
		familySite("http4", "draft-6 x-ratelimit"))
	c := newClient(t)
	draft6Fields := []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "RateLimit-Policy"}
	xFields := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

	t.Run("draft-7", func(t *testing.T) {
		rs := sequence(t, c, 3, inst.URL("/"))
		for i, r := range rs {
			onlyFields(t, fmt.Sprint("response ", i+1), r, "RateLimit", "RateLimit-Policy")
		}
		wantBucketSequence(t, "draft-7", rs, draft7)
	})
	t.Run("draft-6", func(t *testing.T) {
		rs := sequence(t, c, 3, inst.URLOn("http2", "/"))
		for i, r := range rs {
			onlyFields(t, fmt.Sprint("response ", i+1), r, draft6Fields...)
		}
		wantBucketSequence(t, "draft-6", rs, draft6)
	})
	for _, tc := range []struct {
		name, listener string
		read           func(*testing.T, response) draftState
		fields         []string
	}{
		{"x-ratelimit draft-7", "http3", draft7, append([]string{"RateLimit", "RateLimit-Policy"}, xFields...)},
		{"draft-6 x-ratelimit", "http4", draft6, append(slices.Clone(draft6Fields), xFields...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := sequence(t, c, 3, inst.URLOn(tc.listener, "/"))
			wantBucketSequence(t, tc.name, rs, tc.read)
			for i, r := range rs {
				onlyFields(t, fmt.Sprint("response ", i+1), r, tc.fields...)
				// Both describe the same zone.
				got := tc.read(t, r)
				if l, rem := intHeader(t, r, "X-RateLimit-Limit"), intHeader(t, r, "X-RateLimit-Remaining"); l != got.limit || rem != got.remaining {
					t.Errorf("response %d: X-RateLimit-Limit %d, -Remaining %d; the draft says %d and %d", i+1, l, rem, got.limit, got.remaining)
				}
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		server := func(listener, headers string) string {
			return fmt.Sprintf(`"%[1]s": {"listen": ["{{%[1]s}}"], "automatic_https": {"disable": true}, "routes": [{"handle": [
				{"handler": "rate_limit", "headers": %[2]s, "rate_limits": {
					"bucket_%[1]s": {"key": "{http.vars.client_ip}", "algorithm": "token_bucket", "max_events": 2, "window": "1h"},
					"hourly_%[1]s": {"key": "{http.vars.client_ip}", "algorithm": "fixed_window", "max_events": 100, "window": "1h"}}},
				{"handler": "static_response", "body": "ok"}]}]}`, listener, headers)
		}
		js := caddyproc.StartJSON(t, `{
  "admin": {"listen": "{{admin}}"},
  "apps": {"http": {"servers": {
    `+server("http", `"draft-6"`)+`,
    `+server("http2", `["x-ratelimit", "draft-7"]`)+`
  }}}
}`)
		rs := sequence(t, c, 3, js.URL("/"))
		for i, r := range rs {
			onlyFields(t, fmt.Sprint("a string: response ", i+1), r, draft6Fields...)
		}
		wantBucketSequence(t, "a string", rs, draft6)
		rs = sequence(t, c, 3, js.URLOn("http2", "/"))
		for i, r := range rs {
			onlyFields(t, fmt.Sprint("a list: response ", i+1), r, append([]string{"RateLimit", "RateLimit-Policy"}, xFields...)...)
		}
		wantBucketSequence(t, "a list", rs, draft7)
	})
}

// TestHTTPHeaderFamiliesRefused: a config whose families write the same
// field does not load, and the error names them, the field and the line.
func TestHTTPHeaderFamiliesRefused(t *testing.T) {
	t.Parallel()
	inst := caddyproc.Start(t, globals+familySite("http", "draft-7"))
	cfg := globals + familySite("http", "x-ratelimit ietf draft-7")
	err := inst.Load(cfg)
	line := 1 + strings.Count(cfg[:strings.Index(cfg, "headers x-ratelimit")], "\n")
	for _, want := range []string{"ietf and draft-7 cannot be combined", "both write RateLimit and RateLimit-Policy", fmt.Sprintf("Caddyfile:%d", line)} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("loading headers x-ratelimit ietf draft-7: %v, want an error containing %q", err, want)
		}
	}
	// The running config still answers with its own families.
	r := get(t, newClient(t), inst.URL("/"))
	onlyFields(t, "after the refused load", r, "RateLimit", "RateLimit-Policy")
}

// headerParserVersion is the npm ratelimit-header-parser the tests read
// the fields with, pinned in testdata/ratelimit-header-parser's package
// lock with its integrity hash.
const headerParserVersion = "0.1.0"

// parserRead is what read.mjs prints of one response: the values the
// parser read (nil where it read none: NaN, an invalid date), the seconds
// from then to the reset it read, and the response's fields, for failures.
type parserRead struct {
	Status    int               `json:"status"`
	Found     bool              `json:"found"`
	Limit     *float64          `json:"limit"`
	Remaining *float64          `json:"remaining"`
	Used      *float64          `json:"used"`
	ResetIn   *float64          `json:"resetIn"`
	Headers   map[string]string `json:"headers"`
}

// TestHeaderParserReads: npm's ratelimit-header-parser, fetching from a
// real Caddy, reads limit, remaining and reset from draft-7 and draft-6
// responses, with x-ratelimit beside them or alone, equal to the bucket's
// state; from today's default (x-ratelimit ietf) it reads nothing, since
// it takes the ietf RateLimit field for draft 7's and finds none of its
// keys, which is why the docs send its users to draft-7 or draft-6.
func TestHeaderParserReads(t *testing.T) {
	t.Parallel()
	dir := headerParser(t)
	inst := caddyproc.Start(t, globals+
		familySite("http", "draft-7")+
		familySite("http2", "draft-6")+
		familySite("http3", "x-ratelimit draft-7")+
		familySite("http4", "x-ratelimit draft-6")+
		familySite("http5", "x-ratelimit")+
		familySite("http6", ""))
	type want struct {
		limit, remaining, resetIn float64
	}
	// Two admitted, then a refusal; reset is a token's refill, the time
	// to fill both, then Retry-After (a token's refill) for the drafts,
	// and for X-RateLimit-Reset, an epoch second, always when the bucket
	// is full again.
	drafts := []want{{2, 1, 1800}, {2, 0, 3600}, {2, 0, 1800}}
	for _, tc := range []struct {
		headers, listener string
		want              []want // nil: the parser reads nothing
	}{
		{"draft-7", "http", drafts},
		{"draft-6", "http2", drafts},
		{"x-ratelimit draft-7", "http3", drafts},
		{"x-ratelimit draft-6", "http4", drafts},
		{"x-ratelimit", "http5", []want{{2, 1, 1800}, {2, 0, 3600}, {2, 0, 3600}}},
		{"x-ratelimit ietf (the default)", "http6", nil},
	} {
		t.Run(tc.headers, func(t *testing.T) {
			url := inst.URLOn(tc.listener, "/")
			reads := readWithParser(t, dir, url, url, url)
			for i, got := range reads {
				what := fmt.Sprintf("headers %s, response %d (%d, %v)", tc.headers, i+1, got.Status, got.Headers)
				if want := []int{200, 200, 429}[i]; got.Status != want {
					t.Fatalf("%s: status %d, want %d", what, got.Status, want)
				}
				if tc.want == nil {
					if got.Limit != nil || got.Remaining != nil {
						t.Errorf("%s: the parser read limit %v, remaining %v; the docs say it reads nothing", what, num(got.Limit), num(got.Remaining))
					}
					continue
				}
				w := tc.want[i]
				if got.Limit == nil || *got.Limit != w.limit || got.Remaining == nil || *got.Remaining != w.remaining ||
					got.Used == nil || *got.Used != w.limit-w.remaining {
					t.Errorf("%s: the parser read limit %v, remaining %v, used %v; want %v, %v, %v",
						what, num(got.Limit), num(got.Remaining), num(got.Used), w.limit, w.remaining, w.limit-w.remaining)
				}
				// The parser counts delta seconds from when it parsed, and
				// an epoch second is rounded up: a few seconds either way.
				if got.ResetIn == nil || math.Abs(*got.ResetIn-w.resetIn) > 3 {
					t.Errorf("%s: the parser read a reset %v seconds away, want about %v", what, num(got.ResetIn), w.resetIn)
				}
			}
		})
	}
}

// num prints a value the parser may not have read.
func num(v *float64) string {
	if v == nil {
		return "nothing"
	}
	return fmt.Sprint(*v)
}

// readWithParser runs read.mjs from dir, where the parser is installed, on
// urls, and returns what it read of each response.
func readWithParser(t *testing.T, dir string, urls ...string) []parserRead {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, "read.mjs")}, urls...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node read.mjs: %v\n%s", err, stderr.String())
	}
	var out []parserRead
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r parserRead
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("read.mjs printed %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	if len(out) != len(urls) {
		t.Fatalf("read.mjs printed %d results for %d URLs:\n%s\n%s", len(out), len(urls), stdout.String(), stderr.String())
	}
	return out
}

// headerParser returns a directory holding read.mjs and npm's
// ratelimit-header-parser, installed with `npm ci` from
// testdata/ratelimit-header-parser's package lock into the user's cache
// (a directory per content of that testdata, made whole or not at all),
// so a run after the first needs neither npm nor the network. Without
// node or npm, or when npm cannot install it, the test is skipped, unless
// CI=true, where it fails: scripts/test.sh installs both.
func headerParser(t *testing.T) string {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (CI=true requires it)", msg)
		}
		t.Skipf("%s; skipping the npm ratelimit-header-parser check (scripts/test.sh installs nodejs and npm)", msg)
	}
	if _, err := exec.LookPath("node"); err != nil {
		unavailable("node is not on PATH")
	}
	src := filepath.Join("testdata", "ratelimit-header-parser")
	files := []string{"package.json", "package-lock.json", "read.mjs"}
	sum := sha256.New()
	contents := map[string][]byte{}
	for _, f := range files {
		b := readFile(t, filepath.Join(src, f))
		contents[f] = b
		fmt.Fprintf(sum, "%s %d\n", f, len(b))
		sum.Write(b)
	}
	if !bytes.Contains(contents["package-lock.json"], []byte(`"version": "`+headerParserVersion+`"`)) {
		t.Fatalf("testdata/ratelimit-header-parser/package-lock.json does not pin version %s", headerParserVersion)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	root := filepath.Join(cache, "floodgate-test")
	dir := filepath.Join(root, "ratelimit-header-parser-"+headerParserVersion+"-"+hex.EncodeToString(sum.Sum(nil))[:12])
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "ratelimit-header-parser", "package.json")); err == nil {
		return dir
	}
	if _, err := exec.LookPath("npm"); err != nil {
		unavailable("npm is not on PATH to install ratelimit-header-parser %s", headerParserVersion)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(root, "install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(tmp, f), contents[f], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		unavailable("npm ci of ratelimit-header-parser %s: %v\n%s", headerParserVersion, err, out)
	}
	// Another test process may have made it meanwhile: either is whole.
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "node_modules", "ratelimit-header-parser", "package.json")); statErr != nil {
			t.Fatalf("installing ratelimit-header-parser into %s: %v", dir, err)
		}
	}
	return dir
}

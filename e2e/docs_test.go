package e2e

// The configs the docs show (README.md and docs/*.md), held to the build
// operators run: every one adapts with cmd/caddy's Caddy, every handler's
// JSON they print is what its Caddyfile adapts to, and the README's first
// Redis config keeps one limit across two instances.

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/docpages"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// needsRE is the first line of a config that needs a module cmd/caddy
// does not include: "# Needs <module ID> (<its repository>), ...".
var needsRE = regexp.MustCompile(`^# Needs ([a-z0-9_.]+) \(`)

// wholeConfig is the Caddyfile a docs block stands for, by the rules
// docs/testing.md states: a block whose first line past its comments is
// `{` (global options) or a site address is a whole Caddyfile, adapted as
// it is; a `redis` block is adapted as the redis block of a rate_limit
// whose one zone keeps its state there; any other block, one that begins
// with a directive (`rate_limit`, `map`, `handle_errors`) or a named
// matcher (`@spent`), is adapted as the directives of a site.
func wholeConfig(block string) string {
	first := ""
	for line := range strings.SplitSeq(block, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			first = line
			break
		}
	}
	word, _, _ := strings.Cut(first, " ")
	switch {
	case strings.HasPrefix(word, "@"):
		// A named matcher: the directives of a site.
	case !regexp.MustCompile(`^[a-z_]+$`).MatchString(word) || word == "localhost":
		return block
	case word == "redis":
		return ":8080 {\n\trate_limit {\n\t\tzone docs {\n\t\t\trate 10/s\n\t\t\tstore redis\n\t\t}\n" + block + "\t}\n\trespond \"ok\"\n}\n"
	}
	return ":8080 {\n" + block + "}\n"
}

// adaptConfig runs `caddy adapt` of the binary operators build
// (cmd/caddy) on a Caddyfile and returns its JSON, or its error output.
func adaptConfig(t *testing.T, caddyfile string) ([]byte, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyproc.Binary(t), "adapt", "--config", path, "--adapter", "caddyfile")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &adaptError{err, stderr.String()}
	}
	return out, nil
}

type adaptError struct {
	err    error
	stderr string
}

func (e *adaptError) Error() string { return e.err.Error() + ": " + e.stderr }

// rateLimitHandlers are the rate_limit handlers of an adapted config,
// wherever its routes nest them.
func rateLimitHandlers(t *testing.T, adapted []byte) []any {
	t.Helper()
	var cfg any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatalf("caddy adapt wrote no JSON: %v\n%s", err, adapted)
	}
	var out []any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				out = append(out, v)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(cfg)
	return out
}

// TestDocsConfigsAdapt: every caddyfile block of README.md and docs/*.md
// adapts with cmd/caddy's Caddy, as wholeConfig makes it whole; a config
// whose first line says it needs a module cmd/caddy does not include is
// refused for that module, and the build indeed lacks it (once it has it,
// the line goes and the config adapts like any other). Every json block
// that is a rate_limit handler is the handler the caddyfile block before
// it on its page adapts to.
func TestDocsConfigsAdapt(t *testing.T) {
	t.Parallel()
	pages, err := docpages.Read("..")
	if err != nil {
		t.Fatal(err)
	}
	modules, err := exec.Command(caddyproc.Binary(t), "list-modules").Output()
	if err != nil {
		t.Fatalf("caddy list-modules: %v", err)
	}
	built := map[string]bool{}
	for m := range strings.FieldsSeq(string(modules)) {
		built[m] = true
	}
	configs := 0
	for _, p := range pages {
		var last *docpages.Block // the page's last caddyfile block
		for _, b := range p.Blocks() {
			where := p.Path + ":" + strconv.Itoa(b.Line)
			switch b.Info {
			case "caddyfile":
				configs++
				last = &b
				if m := needsRE.FindStringSubmatch(b.Text); m != nil {
					if built[m[1]] {
						t.Errorf("%s needs %s, which cmd/caddy now includes: drop the line that says so", where, m[1])
						continue
					}
					refusal := regexp.MustCompile(`module not registered: ` + regexp.QuoteMeta(m[1]) + `\b`)
					if _, err := adaptConfig(t, wholeConfig(b.Text)); err == nil || !refusal.MatchString(err.Error()) {
						t.Errorf("%s needs %s: want caddy adapt to refuse it for that module alone, got %v", where, m[1], err)
					}
					continue
				}
				if _, err := adaptConfig(t, wholeConfig(b.Text)); err != nil {
					t.Errorf("%s does not adapt: %v\n%s", where, err, wholeConfig(b.Text))
				}
			case "json":
				var shown map[string]any
				if json.Unmarshal([]byte(b.Text), &shown) != nil || shown["handler"] != "rate_limit" {
					continue // a log line, or not a handler
				}
				if last == nil {
					t.Errorf("%s shows a rate_limit handler's JSON with no caddyfile block before it", where)
					continue
				}
				adapted, err := adaptConfig(t, wholeConfig(last.Text))
				if err != nil {
					continue // reported above
				}
				handlers := rateLimitHandlers(t, adapted)
				found := false
				for _, h := range handlers {
					found = found || reflect.DeepEqual(h, any(shown))
				}
				if !found {
					got, _ := json.MarshalIndent(handlers, "", "\t")
					t.Errorf("%s is not what the caddyfile block at line %d adapts to; that is:\n%s", where, last.Line, got)
				}
			}
		}
	}
	if configs < 10 {
		t.Errorf("found %d caddyfile blocks in the docs; the pages have more", configs)
	}
}

// TestExampleRedis runs examples/redis.Caddyfile, the README's first Redis
// config, on two instances against one redis-server (the test's own, with
// a timeout of 2s rather than the default 5ms, which a loaded test machine
// can miss): 100 requests of one key through the first are admitted, and
// then neither instance admits another, since both count in Redis; another
// key has its own limit; a request without a key is refused.
func TestExampleRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newUpstream(t, 0)
	redisURL := [2]string{"url redis://localhost:6379", "url redis://" + srv.Addr() + "\n\t\t\ttimeout 2s"}
	a := startExample(t, "redis.Caddyfile", up.url, redisURL)
	b := startExample(t, "redis.Caddyfile", up.url, redisURL)
	c := newClient(t)

	rs := sequence(t, c, 100, a.URL("/orders"), "X-API-Key", "key-1")
	for i, r := range rs {
		if r.code != 200 {
			t.Fatalf("request %d of 100 through the first instance: %d, want 200\n%s", i+1, r.code, a.Log())
		}
	}
	wantCodes(t, "the 101st, through the second instance", sequence(t, c, 1, b.URL("/orders"), "X-API-Key", "key-1"), 429)
	wantCodes(t, "the 102nd, through the first", sequence(t, c, 1, a.URL("/orders"), "X-API-Key", "key-1"), 429)
	wantCodes(t, "another key, through the second", sequence(t, c, 1, b.URL("/orders"), "X-API-Key", "key-2"), 200)
	wantCodes(t, "no key", sequence(t, c, 1, b.URL("/orders")), 429)

	keys, err := srv.Client(t).Keys(context.Background(), "floodgate:per_api_key:{"+keyHash("key-1")+"}*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("Redis holds no key of zone per_api_key for key-1 (%v, %v)", keys, err)
	}
}

package e2e

// The test of docs/coming-from-mholt.md: its Floodgate config runs, a
// real Prometheus scrapes it, and every query and alerting rule on the
// page is evaluated by that Prometheus; the mholt expressions it
// translates parse and name only mholt's metric families.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/proc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// mholtPage is the compatibility page, from this package's directory.
const mholtPage = "../docs/coming-from-mholt.md"

// mholtFamilies are the metric families mholt/caddy-ratelimit exports
// (its metrics.go as of commit 5625512, "re-register collectors on each
// config reload"), histograms by their series.
var mholtFamilies = []string{
	"caddy_rate_limit_requests_total",
	"caddy_rate_limit_declined_requests_total",
	"caddy_rate_limit_process_time_seconds_bucket",
	"caddy_rate_limit_process_time_seconds_sum",
	"caddy_rate_limit_process_time_seconds_count",
	"caddy_rate_limit_keys_total",
	"caddy_rate_limit_config",
}

// mholtPrefix marks, in the page's promql and yaml blocks, the mholt
// expression that the Floodgate one after it replaces.
const mholtPrefix = "# mholt: "

// migrationPage is what the test reads of the page.
type migrationPage struct {
	// queries are the Floodgate PromQL of the promql blocks, one a line;
	// mholt the expressions after mholtPrefix, in promql and yaml blocks.
	queries, mholt []string
	// rules is the yaml block: a Prometheus rule file.
	rules string
	// adminURLs are the admin API URLs the sh blocks curl.
	adminURLs []string
	// caddyfiles are the caddyfile blocks.
	caddyfiles []string
}

var fenceBlock = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```")

func readMigrationPage(t *testing.T) migrationPage {
	t.Helper()
	var p migrationPage
	for _, m := range fenceBlock.FindAllStringSubmatch(string(readFile(t, mholtPage)), -1) {
		lang, body := m[1], m[2]
		switch lang {
		case "promql":
			// Each query follows the mholt expression it replaces.
			translates := false
			for line := range strings.SplitSeq(body, "\n") {
				line = strings.TrimSpace(line)
				switch {
				case strings.HasPrefix(line, mholtPrefix):
					p.mholt = append(p.mholt, strings.TrimPrefix(line, mholtPrefix))
					translates = true
				case line == "" || strings.HasPrefix(line, "#"):
				case !translates:
					t.Fatalf("%s: the query %s follows no %q line", mholtPage, line, mholtPrefix)
				default:
					p.queries = append(p.queries, line)
					translates = false
				}
			}
		case "yaml":
			if p.rules != "" {
				t.Fatalf("%s has two yaml blocks; the test takes the one as the rule file", mholtPage)
			}
			p.rules = body
			for line := range strings.SplitSeq(body, "\n") {
				if q, ok := strings.CutPrefix(strings.TrimSpace(line), mholtPrefix); ok {
					p.mholt = append(p.mholt, q)
				}
			}
		case "sh":
			for f := range strings.FieldsSeq(body) {
				if f = strings.Trim(f, `'"`); strings.HasPrefix(f, "localhost:2019/") {
					p.adminURLs = append(p.adminURLs, strings.TrimPrefix(f, "localhost:2019"))
				}
			}
		case "caddyfile":
			p.caddyfiles = append(p.caddyfiles, body)
		default:
			t.Fatalf("%s has a %q block, which the test does not check", mholtPage, lang)
		}
	}
	return p
}

// floodgateConfig is the page's Floodgate config, which has zones with
// `store redis`, run on redisAddr with a decision timeout that a loaded
// machine does not reach (the page leaves the default).
func (p migrationPage) floodgateConfig(t *testing.T, redisAddr string) string {
	t.Helper()
	const pageURL = "url redis://redis.internal:6379"
	for _, c := range p.caddyfiles {
		if strings.Contains(c, "\tredis {") {
			if !strings.Contains(c, pageURL) {
				t.Fatalf("the page's Floodgate config no longer has %q", pageURL)
			}
			return strings.Replace(c, pageURL, "url redis://"+redisAddr+"\n\t\ttimeout "+redisTimeout, 1)
		}
	}
	t.Fatalf("%s has no caddyfile block with a redis block", mholtPage)
	return ""
}

// TestComingFromMholt runs the page's Floodgate config beside a memory
// zone, has a real Prometheus scrape it every second and evaluate the
// page's rule file, drives allowed and refused requests, then evaluates
// every query on the page.
func TestComingFromMholt(t *testing.T) {
	t.Parallel()
	page := readMigrationPage(t)
	if len(page.queries) == 0 || page.rules == "" || len(page.adminURLs) < 2 || len(page.caddyfiles) != 2 {
		t.Fatalf("%s: read %d queries, %d mholt expressions, %d admin URLs, %d caddyfile blocks and a rule file of %d bytes; is the page whole?",
			mholtPage, len(page.queries), len(page.mholt), len(page.adminURLs), len(page.caddyfiles), len(page.rules))
	}
	promBin := prometheusBinary(t)
	srv := redistest.Start(t)
	inst := caddyproc.Start(t, globals+`
http://{{http}} {
	handle /memory {
		rate_limit {
			zone memory_example {
				key    {remote_host}
				events 2
				window 1m
			}
		}
		respond "ok"
	}
	handle {
`+indent(page.floodgateConfig(t, srv.Addr()), "\t\t")+`
		respond "ok"
	}
}
`)
	zones := []string{"dynamic_example", "memory_example", "static_example"}
	prom := startPrometheus(t, promBin, inst.Addr("admin"), page.rules)

	// Scraped before any request, so each counter's first sample is 0
	// and rates over the traffic below are above 0.
	prom.waitFor(t, "a scrape of every zone's decision counters", func() error {
		v, err := prom.query(`count by (zone) (caddy_http_rate_limit_decisions_total)`)
		if err == nil && len(v) != len(zones) {
			err = fmt.Errorf("zones %v, want %v", v.labels("zone"), zones)
		}
		return err
	})
	c := newClient(t)
	wantCodes(t, "dynamic_example (2 per 5s)", sequence(t, c, 6, inst.URL("/")), 200, 200, 429, 429, 429, 429)
	wantCodes(t, "memory_example (2 per minute)", sequence(t, c, 3, inst.URL("/memory")), 200, 200, 429)
	prom.waitFor(t, "a scrape of the refusals", func() error {
		v, err := prom.query(`sum(caddy_http_rate_limit_decisions_total{result="denied"})`)
		if err == nil && (len(v) != 1 || v[0].value(t) != 5) {
			err = fmt.Errorf("%v, want 5 refusals", v)
		}
		return err
	})
	scraped := time.Now()

	for _, q := range page.queries {
		v, err := prom.query(q)
		if err != nil {
			t.Errorf("%s\n\t%v", q, err)
			continue
		}
		t.Logf("%s\n\t%v", q, v)
		checkMigrationResult(t, q, v, zones)
	}

	for _, q := range page.mholt {
		for _, name := range promMetricNames(q) {
			if !slices.Contains(mholtFamilies, name) {
				t.Errorf("the mholt expression %s reads %s, which is not one of mholt's metrics %v", q, name, mholtFamilies)
			}
		}
		if v, err := prom.query(q); err != nil {
			t.Errorf("the mholt expression %s does not parse: %v", q, err)
		} else if len(v) > 0 && !strings.HasPrefix(q, "absent(") {
			t.Errorf("the mholt expression %s has a result on Floodgate: %v", q, v)
		}
	}
	for _, family := range mholtFamilies {
		if !slices.ContainsFunc(page.mholt, func(q string) bool { return slices.Contains(promMetricNames(q), family) }) {
			t.Errorf("no mholt expression on the page reads %s: the page does not say what replaces it", family)
		}
	}

	checkMigrationRules(t, prom, page.rules, scraped)

	for _, path := range page.adminURLs {
		var answer any
		if code := adminCall(t, inst, http.MethodGet, path, &answer); code != http.StatusOK {
			t.Errorf("GET %s: %d %v", path, code, answer)
			continue
		}
		if strings.Contains(path, "/top") {
			var top zoneTop
			adminCall(t, inst, http.MethodGet, path, &top)
			if len(top.Keys) == 0 || top.Keys[0].Denied == 0 {
				t.Errorf("GET %s: %+v, want the key that was refused", path, top)
			}
		} else if list, ok := answer.([]any); !ok || len(list) != len(zones) {
			t.Errorf("GET %s: %v, want the %d zones", path, answer, len(zones))
		}
	}
}

// TestComingFromMholtConfigLoads: the page's mholt config is accepted as
// it is (its `distributed` ignored), as the page says.
func TestComingFromMholtConfigLoads(t *testing.T) {
	t.Parallel()
	page := readMigrationPage(t)
	var mholt string
	for _, c := range page.caddyfiles {
		if strings.Contains(c, "\tdistributed\n") {
			mholt = c
		}
	}
	if mholt == "" {
		t.Fatalf("%s has no caddyfile block with `distributed`", mholtPage)
	}
	inst := caddyproc.Start(t, globals+"\nhttp://{{http}} {\n"+indent(mholt, "\t")+"\trespond \"ok\"\n}\n")
	c := newClient(t)
	wantCodes(t, "dynamic_example (2 per 5s)", sequence(t, c, 3, inst.URL("/")), 200, 200, 429)
	if !strings.Contains(inst.Log(), "distributed and storage options of mholt/caddy-ratelimit are accepted but not used") {
		t.Errorf("no warning that distributed is not used:\n%s", inst.Log())
	}
}

// indent prefixes every non-empty line of s with prefix.
func indent(s, prefix string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimRight(s, "\n"), "\n") {
		if line != "" {
			b.WriteString(prefix)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// checkMigrationResult checks what a Floodgate query of the page
// answered after the traffic: some series, each a finite number from 0
// up, at least one above 0, and any zone it names one of the config's.
func checkMigrationResult(t *testing.T, q string, v promVector, zones []string) {
	t.Helper()
	if len(v) == 0 {
		t.Errorf("%s\n\tanswered no series", q)
		return
	}
	positive := false
	for _, s := range v {
		x := s.value(t)
		if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			t.Errorf("%s\n\t%v: %v is not a finite number from 0 up", q, s.Metric, x)
		}
		positive = positive || x > 0
		if z, ok := s.Metric["zone"]; ok && !slices.Contains(zones, z) {
			t.Errorf("%s\n\tnames zone %q, not one of %v", q, z, zones)
		}
	}
	if !positive {
		t.Errorf("%s\n\tevery series is 0: %v", q, v)
	}
}

// checkMigrationRules checks the page's rule file as Prometheus loaded
// it: every rule evaluates without error, every metric its expressions
// read is scraped, and once evaluated after scraped (when Prometheus had
// scraped the traffic) the refusal alert is active for the two zones that
// refused a third of their requests or more, and for no other.
func checkMigrationRules(t *testing.T, prom *prometheusServer, rules string, scraped time.Time) {
	t.Helper()
	want := strings.Count(rules, "- alert: ")
	var loaded []promRule
	prom.waitFor(t, "an evaluation of every rule after the traffic", func() error {
		var err error
		if loaded, err = prom.rules(); err != nil {
			return err
		}
		if len(loaded) != want {
			return fmt.Errorf("%d rules loaded, the page has %d", len(loaded), want)
		}
		for _, r := range loaded {
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q (%s)", r.Name, r.Health, r.LastError)
			}
			if r.LastEvaluation.Before(scraped) {
				return fmt.Errorf("rule %s last evaluated at %v, before the traffic", r.Name, r.LastEvaluation)
			}
		}
		return nil
	})
	for _, r := range loaded {
		for _, name := range promMetricNames(r.Query) {
			if v, err := prom.query(`count({__name__="` + name + `"})`); err != nil || len(v) == 0 {
				t.Errorf("rule %s reads %s, which Prometheus has not scraped (%v)", r.Name, name, err)
			}
		}
		var active []string
		for _, a := range r.Alerts {
			active = append(active, a.Labels["zone"])
		}
		slices.Sort(active)
		switch r.Name {
		case "RateLimitRefusingMany":
			if want := []string{"dynamic_example", "memory_example"}; !slices.Equal(active, want) {
				t.Errorf("rule %s is active for zones %q, want %q", r.Name, active, want)
			}
		case "RateLimitGone", "RateLimitStoreDown":
			if len(r.Alerts) > 0 {
				t.Errorf("rule %s is active: %+v", r.Name, r.Alerts)
			}
		}
	}
}

// prometheusBinary is the prometheus on PATH. Without one the test is
// skipped, unless CI=true: there it fails, so CI cannot pass without
// having run it (scripts/test.sh installs Debian's package).
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	switch {
	case err == nil:
		return bin
	case os.Getenv("CI") == "true":
		t.Fatalf("prometheus is not on PATH (CI=true requires it): %v", err)
	default:
		t.Skipf("prometheus is not on PATH: %v", err)
	}
	return ""
}

// prometheusServer is one prometheus process on loopback.
type prometheusServer struct {
	base string // http://127.0.0.1:<port>
	log  *os.File
}

// startPrometheus runs prometheus on a free loopback port, scraping
// Caddy's admin endpoint target's /metrics and evaluating rules every
// second; it is stopped by t.Cleanup.
func startPrometheus(t *testing.T, bin, target, rules string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yml")
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: [%q]
`, rulesPath, target)
	configPath := filepath.Join(dir, "prometheus.yml")
	for path, text := range map[string]string{rulesPath: rules, configPath: config} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var last error
	for attempt := range 3 {
		port, err := testutil.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		logFile, err := os.Create(filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", attempt)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin,
			"--config.file="+configPath,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data-%d", attempt)),
			"--web.listen-address="+fmt.Sprintf("127.0.0.1:%d", port),
			"--log.level=warn",
		)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatalf("running %s: %v", bin, err)
		}
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		p := &prometheusServer{base: fmt.Sprintf("http://127.0.0.1:%d", port), log: logFile}
		if last = p.waitReady(cmd.Process.Pid, port, done); last == nil {
			t.Cleanup(func() {
				proc.Stop(cmd.Process, done, 10*time.Second, syscall.SIGTERM)
				_ = logFile.Close()
			})
			return p
		}
		proc.Stop(cmd.Process, done, 10*time.Second, syscall.SIGTERM)
		last = fmt.Errorf("%w\n--- prometheus output ---\n%s", last, p.output())
		_ = logFile.Close()
	}
	t.Fatalf("starting prometheus: %v", last)
	return nil
}

// waitReady waits until the process answers /-/ready on port, from a
// socket of its own (see proc.Listens).
func (p *prometheusServer) waitReady(pid, port int, exited <-chan struct{}) error {
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Get(p.base + "/-/ready")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && proc.Listens(pid, port) {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("prometheus exited before it was ready")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("prometheus was not ready within a minute")
		}
	}
}

// output is what the process has logged.
func (p *prometheusServer) output() string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
}

// waitFor polls cond every 200ms, Prometheus scraping and evaluating
// once a second, and fails t with cond's last error and Prometheus's log
// if it does not hold within 30 seconds.
func (p *prometheusServer) waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v\n--- prometheus output ---\n%s", what, err, p.output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promSample is one series of an instant vector.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [time, "value"]
}

func (s promSample) value(t *testing.T) float64 {
	t.Helper()
	str, _ := s.Value[1].(string)
	x, err := strconv.ParseFloat(str, 64)
	if err != nil {
		t.Fatalf("series %v: value %v: %v", s.Metric, s.Value[1], err)
	}
	return x
}

type promVector []promSample

// labels are the values of label across the vector.
func (v promVector) labels(label string) []string {
	var out []string
	for _, s := range v {
		out = append(out, s.Metric[label])
	}
	slices.Sort(out)
	return out
}

// api GETs path (with its query) from the HTTP API and decodes the data
// of a successful answer into out; an error answer (a query that does not
// parse) is an error.
func (p *prometheusServer) api(path string, out any) error {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var answer struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return fmt.Errorf("GET %s: %d: %w", path, resp.StatusCode, err)
	}
	if answer.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, answer.ErrorType, answer.Error)
	}
	return json.Unmarshal(answer.Data, out)
}

// query evaluates q at the current time; its result must be an instant
// vector.
func (p *prometheusServer) query(q string) (promVector, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query?query="+url.QueryEscape(q), &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("a %s, want a vector", data.ResultType)
	}
	var v promVector
	return v, json.Unmarshal(data.Result, &v)
}

// promRule is an alerting rule as /api/v1/rules reports it.
type promRule struct {
	Name           string    `json:"name"`
	Query          string    `json:"query"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
	Alerts         []struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	} `json:"alerts"`
}

// rules are the alerting rules Prometheus loaded.
func (p *prometheusServer) rules() ([]promRule, error) {
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api("/api/v1/rules?type=alert", &data); err != nil {
		return nil, err
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

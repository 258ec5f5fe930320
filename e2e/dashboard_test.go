package e2e

// Tests of examples/grafana-dashboard.json: its structure, and that every
// metric it reads is one a real Caddy with Floodgate exports.

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboardFile is the Grafana dashboard docs/metrics.md tells operators to
// import, from this package's directory.
const dashboardFile = "../examples/grafana-dashboard.json"

// dashboard is the part of a Grafana dashboard these tests read.
type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Datasource dataSource      `json:"datasource"`
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"` // a string, or {"query": "..."}
		} `json:"list"`
	} `json:"templating"`
}

type dashboardPanel struct {
	Title      string           `json:"title"`
	Type       string           `json:"type"`
	Datasource *dataSource      `json:"datasource"`
	Panels     []dashboardPanel `json:"panels"` // a collapsed row's
	Targets    []struct {
		Datasource *dataSource `json:"datasource"`
		Expr       string      `json:"expr"`
	} `json:"targets"`
}

type dataSource struct {
	UID string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// queries are the dashboard's PromQL, each named by where it is: every
// panel target's expr and every templating query.
func (d dashboard) queries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(panels []dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			for i, tg := range p.Targets {
				out["panel "+p.Title+" target "+string(rune('A'+i))] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Fatalf("variable %s: query %s: %v", v.Name, v.Query, err)
			}
			q = obj.Query
		}
		out["variable "+v.Name+" query"] = q
		out["variable "+v.Name+" definition"] = v.Definition
	}
	return out
}

// Pieces of PromQL that name no metric, removed before the names are
// read: string literals, label matchers, range and subquery brackets, and
// the label lists of grouping modifiers.
var (
	promStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// labelValues is Grafana's label_values(<series selector>, <label>).
	labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
)

// promKeywords are the identifiers of PromQL that are not metric names
// and need not be followed by a parenthesis: keywords, and aggregations
// whose grouping comes first (sum by (zone) (...)).
var promKeywords = []string{
	"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN",
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}

// promMetricNames returns the metric names a PromQL expression or a
// Grafana Prometheus variable query reads: every identifier that is not a
// function or aggregation (followed by '('), a keyword, a label, a number's
// exponent or duration unit, or a Grafana variable.
func promMetricNames(query string) []string {
	if m := labelValues.FindStringSubmatch(query); m != nil {
		query = m[1]
	} else if strings.HasPrefix(strings.TrimSpace(query), "label_values(") {
		return nil // label_values(<label>): every metric
	}
	expr := promStrings.ReplaceAllString(query, `""`)
	expr = promMatchers.ReplaceAllString(expr, " ")
	expr = promGrouping.ReplaceAllString(expr, "$1")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsRune("0123456789.$", rune(expr[loc[0]-1])) {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(expr[loc[1]:], " \t\n"), "(") || slices.Contains(promKeywords, name) {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// TestPromMetricNames: the names read from queries like the dashboard's,
// and a name the dashboard could get wrong is found wherever it stands.
func TestPromMetricNames(t *testing.T) {
	for query, want := range map[string][]string{
		`sum by (zone, result) (rate(caddy_x_total{zone=~"$zone"}[$__rate_interval]))`:                                 {"caddy_x_total"},
		`histogram_quantile(0.99, sum by (zone, le) (rate(caddy_x_seconds_bucket{zone=~"a{b}"}[5m])))`:                 {"caddy_x_seconds_bucket"},
		"sum by (zone, source) (rate(a_total[1m]))\n/ ignoring (source) group_left\nsum by (zone) (rate(b_total[1m]))": {"a_total", "b_total"},
		`min by (zone) (up_gauge{zone=~"$zone"}) > 0.5e-3 and on (zone) other offset 5m`:                               {"up_gauge", "other"},
		`label_values(caddy_x_total, zone)`:                  {"caddy_x_total"},
		`label_values(caddy_x_total{result="denied"}, zone)`: {"caddy_x_total"},
		`label_values(zone)`:                                 nil,
		`rate(typo_totl[5m]) / rate(b[5m])`:                  {"typo_totl", "b"},
		`sum without (instance) (a) * 2 + bogus`:             {"a", "bogus"},
	} {
		if got := promMetricNames(query); !slices.Equal(got, want) {
			t.Errorf("promMetricNames(%q) = %q, want %q", query, got, want)
		}
	}
}

// TestDashboardStructure: the dashboard imports into any Grafana: its
// Prometheus is the ${DS_PROMETHEUS} input everywhere, and the zone
// variable lists the zones that decided something.
func TestDashboardStructure(t *testing.T) {
	d := readDashboard(t)
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs: %+v, want the one prometheus input DS_PROMETHEUS", d.Inputs)
	}
	const ds = "${DS_PROMETHEUS}"
	var targets int
	var walk func(panels []dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != ds) {
				t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, ds)
			}
			for _, tg := range p.Targets {
				targets++
				if tg.Datasource == nil || tg.Datasource.UID != ds {
					t.Errorf("panel %q: a target's datasource is %+v, want uid %s", p.Title, tg.Datasource, ds)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if targets == 0 {
		t.Error("the dashboard has no panel targets")
	}
	var zone bool
	for _, v := range d.Templating.List {
		if v.Name == "zone" {
			zone = v.Datasource.UID == ds && v.Definition == "label_values(caddy_http_rate_limit_decisions_total, zone)"
		}
	}
	if !zone {
		t.Errorf("templating: %+v, want a zone variable on %s from label_values(caddy_http_rate_limit_decisions_total, zone)", d.Templating.List, ds)
	}
}

// TestDashboardMetrics: every metric the dashboard reads, in its panels
// and its variables, is one a real Caddy exports on /metrics once a
// redis zone with local_quota has decided (histograms
// by their _bucket, _sum and _count series); and every metric family the
// handler exports has a panel.
func TestDashboardMetrics(t *testing.T) {
	t.Parallel()
	_, inst := startRedisSite(t, redisTimeout,
		redisRoute{path: "/red", zone: "key {header.X-Client}\nalgorithm fixed_window\nrate 2/1h\nlocal_quota 0.5"},
	)
	c := newClient(t)
	wantCodes(t, "red", sequence(t, c, 4, inst.URL("/red"), "X-Client", "k"), 200, 200, 429, 429)
	exported := map[string]bool{}
	for line := range strings.SplitSeq(get(t, c, inst.Admin()+"/metrics").body, "\n") {
		if end := strings.IndexAny(line, "{ "); end > 0 && strings.HasPrefix(line, "caddy_http_rate_limit_") {
			exported[line[:end]] = true
		}
	}
	families := map[string]bool{}
	for name := range exported {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && exported[base+"_bucket"] {
				name = base
			}
		}
		families[name] = false
	}
	// docs/metrics.md lists eleven: all but response_costs_total, which
	// only a response_cost zone exports.
	if len(families) != 10 {
		t.Errorf("/metrics has the families %v, want the ten of the eleven docs/metrics.md lists that a redis zone exports\n%s", families, inst.Log())
	}
	var unknown []string
	for where, query := range readDashboard(t).queries(t) {
		names := promMetricNames(query)
		if len(names) == 0 {
			t.Errorf("%s reads no metric: %q", where, query)
		}
		for _, name := range names {
			if !exported[name] {
				unknown = append(unknown, where+" reads "+name)
			}
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok {
					if _, known := families[base]; known {
						families[base] = true
					}
				}
			}
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		t.Errorf("the dashboard reads metrics the handler does not export:\n\t%s\nit exports %v", strings.Join(unknown, "\n\t"), slices.Sorted(maps.Keys(exported)))
	}
	for family, used := range families {
		if !used {
			t.Errorf("no panel of the dashboard reads %s", family)
		}
	}
}

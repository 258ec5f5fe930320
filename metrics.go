package ratelimit

import (
	"errors"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// zoneMetrics are one zone's counters, resolved once at provision so the
// request path only increments them.
type zoneMetrics struct {
	allowed, denied, dryRunDenied, passed, storeFailures prometheus.Counter
	// fromLease and fromDenyCache count a redis zone's decisions made in
	// memory by its near cache.
	fromLease, fromDenyCache prometheus.Counter
	// decisionSeconds times each decision of the zone, a Redis round trip
	// included.
	decisionSeconds prometheus.Observer
	// responseCosts counts a response_cost zone's responses by what their
	// cost was (see responseCostResult); nil for other zones.
	responseCosts []prometheus.Counter
	// overridden counts decisions made under an override, by action
	// (limiter.OverrideAction - 1).
	overridden [3]prometheus.Counter
}

// responseCostResult is what a response said of its cost.
type responseCostResult int

// The results of reading a response's cost, in responseCostResults' order.
const (
	responseCostRead    responseCostResult = iota // an integer within the quota
	responseCostCapped                            // above the quota: the quota is charged
	responseCostMissing                           // no such header or trailer: the up-front cost stands
	responseCostInvalid                           // not an integer from 0 up: the up-front cost stands
)

// responseCostResults label the results on /metrics.
var responseCostResults = []string{"read", "capped", "missing", "invalid"}

// metricVecs are the handler's metric families on Caddy's registry.
type metricVecs struct {
	decisions     *prometheus.CounterVec
	storeFailures *prometheus.CounterVec
	local         *prometheus.CounterVec
	responseCosts *prometheus.CounterVec
	overrides     *prometheus.CounterVec
	seconds       *prometheus.HistogramVec
	// globalRefills and globalUnits count what the regions of zones with
	// a global server take from it and give back (see regionCounters).
	globalRefills *prometheus.CounterVec
	globalUnits   *prometheus.CounterVec
	// reclaims counts lease reclaims asked and heard (reclaims.go).
	reclaims *prometheus.CounterVec
}

// decisionBuckets are the decision-time histogram's buckets, from 5 µs (a
// memory decision) to 100 ms (far past any Redis timeout worth setting),
// dense around the 1 ms a decision may add to a request at p99.
var decisionBuckets = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1}

// metricFamilies are the handler's metric families, one set for the
// process: every config load registers the same collectors on its
// registry, so counts carry on across reloads (Caddy gives each loaded
// config a registry of its own) and two handlers never register a family
// twice.
var metricFamilies = &metricVecs{
	decisions:     counterVec("decisions_total", "Rate-limit decisions by zone and result (allowed, denied, dry_run_denied, passed).", "result"),
	storeFailures: counterVec("store_failures_total", "Store errors and timeouts by zone and the fail mode that applied.", "fail"),
	local:         counterVec("local_decisions_total", "Decisions of redis zones made in memory without a round trip, by zone and source (lease, deny_cache).", "source"),
	responseCosts: counterVec("response_costs_total", "Responses of response_cost zones by zone and what their cost header said: read, capped (above the quota, which is charged), missing or invalid (the up-front cost stands).", "result"),
	overrides:     counterVec("override_decisions_total", "Requests decided under a runtime override, by zone and the override's action (limit, block, exempt); they count in decisions_total too.", "action"),
	globalRefills: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      "global_refills_total",
		Help:      "Batches of units this instance took from the global server for its region, by zone (zones whose redis block has a global server).",
	}, []string{"zone"}),
	reclaims:    counterVec("lease_reclaims_total", "Requests for a key's lease units between the instances (and sites) of leased redis zones, by zone and side: asked (Redis refused this instance a key) or heard (another asked this one, which returned what it held of the key).", "side"),
	globalUnits: counterVec("global_units_total", "Units this instance moved between its region and the global server, by zone and movement: taken (in refills) or returned (unspent, or given back).", "movement"),
	seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      "decision_seconds",
		Help:      "Time to decide one zone for one request, a Redis round trip included, by redis zone (a memory zone decides in under the first bucket).",
		Buckets:   decisionBuckets,
	}, []string{"zone"}),
}

// counterVec is a counter family caddy_http_rate_limit_<name>, labelled
// by zone and label.
func counterVec(name, help, label string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      name,
		Help:      help,
	}, []string{"zone", label})
}

// registerMetrics registers the metric families on the config's registry,
// once however many handlers the config has.
func registerMetrics(ctx caddy.Context) (*metricVecs, error) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil, nil
	}
	m := metricFamilies
	for _, c := range []prometheus.Collector{m.decisions, m.storeFailures, m.local, m.responseCosts, m.overrides, m.seconds, m.globalRefills, m.globalUnits, m.reclaims, zoneGauges} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) || are.ExistingCollector != c {
				return nil, err
			}
		}
	}
	return m, nil
}

// forgetZone drops the series of a zone no running config declares any
// more, so a removed zone does not stay on /metrics.
func (m *metricVecs) forgetZone(name string) {
	labels := prometheus.Labels{"zone": name}
	m.decisions.DeletePartialMatch(labels)
	m.storeFailures.DeletePartialMatch(labels)
	m.local.DeletePartialMatch(labels)
	m.responseCosts.DeletePartialMatch(labels)
	m.overrides.DeletePartialMatch(labels)
	m.seconds.DeletePartialMatch(labels)
	m.globalRefills.DeletePartialMatch(labels)
	m.globalUnits.DeletePartialMatch(labels)
	m.reclaims.DeletePartialMatch(labels)
}

// reclaimCounters are a leased zone's counts of lease reclaims; a nil one
// counts nothing.
type reclaimCounters struct {
	asked, heard prometheus.Counter
}

// forReclaims resolves zone name's reclaim counters; a nil receiver gives
// nil (no metrics).
func (m *metricVecs) forReclaims(name string) *reclaimCounters {
	if m == nil {
		return nil
	}
	return &reclaimCounters{asked: m.reclaims.WithLabelValues(name, "asked"), heard: m.reclaims.WithLabelValues(name, "heard")}
}

// countAsked counts a reclaim this zone asked for; safe on nil.
func (rc *reclaimCounters) countAsked() {
	if rc != nil {
		rc.asked.Inc()
	}
}

// countHeard counts a reclaim this zone heard; safe on nil.
func (rc *reclaimCounters) countHeard() {
	if rc != nil {
		rc.heard.Inc()
	}
}

// regionCounters are a regional zone's counters of its dealings with the
// global server; a nil one counts nothing.
type regionCounters struct {
	refills, taken, back prometheus.Counter
}

// forRegion resolves zone name's regional counters; a nil receiver gives
// nil (no metrics).
func (m *metricVecs) forRegion(name string) *regionCounters {
	if m == nil {
		return nil
	}
	return &regionCounters{
		refills: m.globalRefills.WithLabelValues(name),
		taken:   m.globalUnits.WithLabelValues(name, "taken"),
		back:    m.globalUnits.WithLabelValues(name, "returned"),
	}
}

// refilled counts a batch of units global granted; safe on nil.
func (rc *regionCounters) refilled(units int64) {
	if rc != nil {
		rc.refills.Inc()
		rc.taken.Add(float64(units))
	}
}

// returned counts units given back to global; safe on nil.
func (rc *regionCounters) returned(units int64) {
	if rc != nil {
		rc.back.Add(float64(units))
	}
}

// forZone resolves a zone's counters, its decision-time histogram when
// the zone is timed (a redis zone) and its response-cost counters when it
// reads costs from responses; a nil receiver gives nil (no metrics).
func (m *metricVecs) forZone(name, fail string, timed, responseCost bool) *zoneMetrics {
	if m == nil {
		return nil
	}
	zm := &zoneMetrics{
		allowed:       m.decisions.WithLabelValues(name, "allowed"),
		denied:        m.decisions.WithLabelValues(name, "denied"),
		dryRunDenied:  m.decisions.WithLabelValues(name, "dry_run_denied"),
		passed:        m.decisions.WithLabelValues(name, "passed"),
		storeFailures: m.storeFailures.WithLabelValues(name, fail),
		fromLease:     m.local.WithLabelValues(name, limiter.SourceLease.String()),
		fromDenyCache: m.local.WithLabelValues(name, limiter.SourceDenyCache.String()),
	}
	for i, a := range []limiter.OverrideAction{limiter.OverrideLimit, limiter.OverrideBlock, limiter.OverrideExempt} {
		zm.overridden[i] = m.overrides.WithLabelValues(name, a.String())
	}
	if timed {
		zm.decisionSeconds = m.seconds.WithLabelValues(name)
	}
	if responseCost {
		for _, result := range responseCostResults {
			zm.responseCosts = append(zm.responseCosts, m.responseCosts.WithLabelValues(name, result))
		}
	}
	return zm
}

// observe records how long one decision of the zone took; safe on nil.
func (zm *zoneMetrics) observe(took time.Duration) {
	if zm != nil && zm.decisionSeconds != nil {
		zm.decisionSeconds.Observe(took.Seconds())
	}
}

// zoneGauges describes the zones of the running config: the keys each
// holds in memory and whether its store answers. One collector for the
// process, reading the zone registry when scraped, so a reload neither
// registers a second nor leaves a removed zone's series behind.
var zoneGauges = &zoneCollector{
	keys: prometheus.NewDesc("caddy_http_rate_limit_keys",
		"Keys a zone holds in memory: a memory zone's state, a redis zone's leases and cached refusals.", []string{"zone"}, nil),
	up: prometheus.NewDesc("caddy_http_rate_limit_store_up",
		"1 while a zone's store decides, 0 while a redis zone's breaker has stopped asking Redis.", []string{"zone"}, nil),
	overrides: prometheus.NewDesc("caddy_http_rate_limit_overrides",
		"Runtime overrides a zone holds (set through the admin API), lapsed ones until they are swept.", []string{"zone"}, nil),
	instanceClock: prometheus.NewDesc("caddy_http_rate_limit_instance_clock",
		"1 while a redis zone decides by this instance's clock because its Redis refuses TIME in scripts, 0 while by Redis's clock.", []string{"zone"}, nil),
}

type zoneCollector struct{ keys, up, overrides, instanceClock *prometheus.Desc }

// Describe implements prometheus.Collector.
func (c *zoneCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.up
	ch <- c.overrides
	ch <- c.instanceClock
}

// Collect implements prometheus.Collector: one series per zone name, of
// the zones whose handler exports metrics. A name two handlers declare
// reports the larger key count and is up only if both are.
func (c *zoneCollector) Collect(ch chan<- prometheus.Metric) {
	type gauges struct {
		keys, overrides        int
		up, remote, onInstance bool
	}
	byName := map[string]*gauges{}
	var names []string
	for _, reg := range zones.all() {
		if !reg.metrics {
			continue
		}
		z := reg.zone
		g := byName[z.name]
		if g == nil {
			g = &gauges{up: true}
			byName[z.name] = g
			names = append(names, z.name)
		}
		g.keys = max(g.keys, z.keysHeld())
		g.overrides = max(g.overrides, z.overrideCount())
		g.up = g.up && z.storeUp()
		g.remote = g.remote || z.limit.remote
		g.onInstance = g.onInstance || z.instanceClock()
	}
	for _, name := range names {
		g := byName[name]
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(g.keys), name)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, boolGauge(g.up), name)
		ch <- prometheus.MustNewConstMetric(c.overrides, prometheus.GaugeValue, float64(g.overrides), name)
		if g.remote {
			ch <- prometheus.MustNewConstMetric(c.instanceClock, prometheus.GaugeValue, boolGauge(g.onInstance), name)
		}
	}
}

// boolGauge is a gauge's value for a yes or no: 1 or 0.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// decisionResult is what a zone did with a request: decisions_total's
// result.
type decisionResult uint8

const (
	resultAllowed decisionResult = iota
	// resultDenied: refused (429).
	resultDenied
	// resultDryRunDenied: over the limit of a dry_run zone, which lets
	// it through as if admitted.
	resultDryRunDenied
	// resultPassed: over the limit of an `exceeded pass` zone, which
	// passes it on taking nothing.
	resultPassed
)

// count records a zone's decision; safe on nil.
func (zm *zoneMetrics) count(res decisionResult, source limiter.Source) {
	if zm == nil {
		return
	}
	switch source {
	case limiter.SourceLease:
		zm.fromLease.Inc()
	case limiter.SourceDenyCache:
		zm.fromDenyCache.Inc()
	}
	switch res {
	case resultAllowed:
		zm.allowed.Inc()
	case resultDryRunDenied:
		zm.dryRunDenied.Inc()
	case resultPassed:
		zm.passed.Inc()
	default:
		zm.denied.Inc()
	}
}

// responseCost records what a response said of its cost; safe on nil.
func (zm *zoneMetrics) responseCost(r responseCostResult) {
	if zm != nil && int(r) < len(zm.responseCosts) {
		zm.responseCosts[r].Inc()
	}
}

// override records a decision made under an override; safe on nil.
func (zm *zoneMetrics) override(a limiter.OverrideAction) {
	if zm != nil && a >= limiter.OverrideLimit && a <= limiter.OverrideExempt {
		zm.overridden[a-1].Inc()
	}
}

// failure records a store failure; safe on nil.
func (zm *zoneMetrics) failure() {
	if zm != nil {
		zm.storeFailures.Inc()
	}
}

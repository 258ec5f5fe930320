package ratelimit

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// zoneMetrics are one zone's counters, resolved once at provision so the
// request path only increments them.
type zoneMetrics struct {
	allowed, denied, dryRunDenied, storeFailures prometheus.Counter
	// fromLease and fromDenyCache count a redis zone's decisions made in
	// memory by its local tier.
	fromLease, fromDenyCache prometheus.Counter
}

// metricVecs are the handler's metric families on Caddy's registry.
type metricVecs struct {
	decisions     *prometheus.CounterVec
	storeFailures *prometheus.CounterVec
	local         *prometheus.CounterVec
}

// registerMetrics registers the metric families on the config's registry,
// reusing them if another rate_limit handler already did.
func registerMetrics(ctx caddy.Context) (*metricVecs, error) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil, nil
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      "decisions_total",
		Help:      "Rate-limit decisions by zone and result (allowed, denied, dry_run_denied).",
	}, []string{"zone", "result"})
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      "store_failures_total",
		Help:      "Store errors and timeouts by zone and the fail mode that applied.",
	}, []string{"zone", "fail"})
	local := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "http_rate_limit",
		Name:      "local_decisions_total",
		Help:      "Decisions of redis zones made in memory without a round trip, by zone and source (lease, deny_cache).",
	}, []string{"zone", "source"})
	var err error
	for _, c := range []**prometheus.CounterVec{&decisions, &failures, &local} {
		if *c, err = registerOrReuse(reg, *c); err != nil {
			return nil, err
		}
	}
	return &metricVecs{decisions: decisions, storeFailures: failures, local: local}, nil
}

func registerOrReuse(reg *prometheus.Registry, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	return c, nil
}

// forZone resolves a zone's counters; a nil receiver gives nil (no metrics).
func (m *metricVecs) forZone(name, fail string) *zoneMetrics {
	if m == nil {
		return nil
	}
	return &zoneMetrics{
		allowed:       m.decisions.WithLabelValues(name, "allowed"),
		denied:        m.decisions.WithLabelValues(name, "denied"),
		dryRunDenied:  m.decisions.WithLabelValues(name, "dry_run_denied"),
		storeFailures: m.storeFailures.WithLabelValues(name, fail),
		fromLease:     m.local.WithLabelValues(name, limiter.SourceLease.String()),
		fromDenyCache: m.local.WithLabelValues(name, limiter.SourceDenyCache.String()),
	}
}

// count records a zone's decision; safe on nil.
func (zm *zoneMetrics) count(allowed, dryRun bool, source limiter.Source) {
	if zm == nil {
		return
	}
	switch source {
	case limiter.SourceLease:
		zm.fromLease.Inc()
	case limiter.SourceDenyCache:
		zm.fromDenyCache.Inc()
	}
	switch {
	case allowed:
		zm.allowed.Inc()
	case dryRun:
		zm.dryRunDenied.Inc()
	default:
		zm.denied.Inc()
	}
}

// failure records a store failure; safe on nil.
func (zm *zoneMetrics) failure() {
	if zm != nil {
		zm.storeFailures.Inc()
	}
}

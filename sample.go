package ratelimit

import (
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// The sources a decision sample names.
const (
	sourceMemory     = "memory"
	sourceRedis      = "redis"
	sourceLease      = "lease"
	sourceDenyCache  = "deny_cache"
	sourceFallback   = "fallback"
	sourceMissingKey = "missing_key"
	sourceOverride   = "override"
)

// sourceOf names where d was made: the zone's memory store, Redis, its
// near cache (a lease or the denial cache), or its `fail local` fallback.
func sourceOf(l *limit, fallback bool, source limiter.Source) string {
	switch {
	case fallback:
		return sourceFallback
	case source == limiter.SourceLease:
		return sourceLease
	case source == limiter.SourceDenyCache:
		return sourceDenyCache
	case l.remote:
		return sourceRedis
	}
	return sourceMemory
}

// sample logs the decision at info level for a LogSample share of the
// decisions, chosen at random, so an operator can see what the limiter
// decides and why without logging every request. The key is logged as its
// hash unless log_key is set.
func (h *Handler) sample(z *zone, key string, d limiter.Decision, source string, took time.Duration) {
	if h.LogSample <= 0 || (h.LogSample < 1 && rand.Float64() >= h.LogSample) {
		return
	}
	keyField := zap.String("key_hash", z.keys.Hex(key))
	if h.LogKey {
		keyField = zap.String("key", key)
	}
	h.logger.Info("rate limit decision",
		zap.String("zone", z.name),
		zap.Bool("allowed", d.Allowed),
		zap.Int64("remaining", d.Remaining),
		zap.String("source", source),
		zap.Duration("duration", took),
		keyField,
	)
}

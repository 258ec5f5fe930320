package ratelimit

import (
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// failLogInterval is how often a zone logs that its store is failing.
const failLogInterval = 10 * time.Second

// logStoreFailure logs that a zone's store failed and which fail mode
// applies, at most once per failLogInterval per zone.
func (h *Handler) logStoreFailure(z *zone, err error) {
	now := h.now().UnixNano()
	last := z.failLogged.Load()
	if now-last < int64(failLogInterval) || !z.failLogged.CompareAndSwap(last, now) {
		return
	}
	if z.dryRun && z.fail == failClosed {
		h.logger.Warn("rate limit store failed; dry_run lets requests through that fail closed would refuse",
			zap.String("zone", z.name), zap.String("fail", z.fail), zap.Bool("dry_run", true),
			zap.Int("would_refuse", http.StatusServiceUnavailable), zap.Error(err))
		return
	}
	h.logger.Warn("rate limit store failed; applying fail mode",
		zap.String("zone", z.name), zap.String("fail", z.fail), zap.Error(err))
}

// warnAtMost returns an OnError hook for a Redis part's background work
// (override refreshes, reclaims, a region's give-backs): it logs msg with
// the error at most once per failLogInterval on clock, since that work
// retries on its own and an outage would otherwise log a line per try.
func warnAtMost(logger *zap.Logger, clock limiter.Clock, msg string) func(error) {
	var logged atomic.Int64
	return func(err error) {
		now := nowOn(clock).UnixNano()
		if last := logged.Load(); now-last >= int64(failLogInterval) && logged.CompareAndSwap(last, now) {
			logger.Warn(msg, zap.Error(err))
		}
	}
}

// logDenial logs a request over a zone's limit at debug level: under a
// flood, one line per refused request would cost more than the refusal
// itself. The access log records every 429. res says what the zone did:
// refused it, or passed it on (passed: true), or in a dry run neither.
func (h *Handler) logDenial(r *http.Request, z *zone, key string, d limiter.Decision, res decisionResult) {
	if !h.debugDenials {
		return
	}
	ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded")
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("zone", z.name),
		zap.Duration("wait", d.RetryAfter),
		zap.String("remote_ip", z.key.clientIP(r)),
		zap.Bool("dry_run", res == resultDryRunDenied),
	}
	if res == resultPassed {
		fields = append(fields, zap.Bool("passed", true))
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", key))
	}
	ce.Write(fields...)
}

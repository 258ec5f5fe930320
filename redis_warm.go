package ratelimit

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// warmBudget bounds the warm start of a config's Redis stores in total,
// so an unreachable Redis delays a start or a reload by at most this long.
const warmBudget = time.Second

// warmRedis connects the handler's Redis client and loads the scripts of
// every Redis store of its zones before the config serves, so the first
// decision after a start or a reload is an ordinary one rather than one
// that also dials and meets NOSCRIPT and so runs past a tight timeout. A
// failure is logged and otherwise ignored: decisions then dial and load
// scripts themselves, and the zones' fail modes apply as ever.
func (h *Handler) warmRedis() {
	var stores []*limiter.Redis
	for _, z := range h.zones {
		for _, l := range z.limits() {
			if l.redis != nil {
				stores = append(stores, l.redis)
			}
		}
	}
	if len(stores) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmBudget)
	defer cancel()
	for _, rs := range stores {
		if err := rs.Preload(ctx); err != nil {
			h.logger.Warn("could not warm up Redis before serving: the first decisions may be slow or follow the zones' fail modes",
				zap.Duration("budget", warmBudget), zap.Error(err))
			return
		}
	}
}

package ratelimit

import (
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/floodgatehq/caddy-ratelimit/limiter/regional"
)

// region is a redis limit's part in a limit shared across regions (the
// redis block's global block): its store on the global server, its pool
// in the region's Redis, and the regional store that decides from the
// pool and refills it from global (see docs/design.md, "Regions").
type region struct {
	store  *regional.Store
	global *redisstore.Store
	pool   *redisstore.Pool
}

// newRegion opens the regional store of one policy of zone name (tier and
// override as for newLimit): the key's true count on the global server,
// the region's units in this region's Redis.
func (h *Handler) newRegion(name, tier string, override bool, p limiter.Policy) (*region, error) {
	g := h.Redis.Global
	globalTimeout := g.timeout()
	global, err := redisstore.New(h.global.UniversalClient, p, h.global.storeOptions(g.KeyPrefix, globalTimeout, h.keys, name, tier, override))
	if err != nil {
		return nil, err
	}
	poolTimeout := time.Duration(h.Redis.Timeout)
	pool, err := redisstore.NewPool(h.redis.UniversalClient, p, h.redis.storeOptions(h.Redis.KeyPrefix, poolTimeout, h.keys, name, tier, override))
	if err != nil {
		return nil, err
	}
	if poolTimeout == 0 {
		poolTimeout = redisstore.DefaultTimeout
	}
	logger := h.logger.With(zap.String("zone", name))
	counters := h.metrics.forRegion(name)
	store, err := regional.New(global, pool, p, regional.Options{
		RegionQuota: g.regionQuota(),
		// A refill holds its key's lock for the global call and the
		// pool's fill; the region's other instances wait no longer.
		LockFor:  max(regional.DefaultLockFor, globalTimeout+2*poolTimeout+50*time.Millisecond),
		Clock:    h.clock,
		OnRefill: counters.refilled,
		OnReturn: counters.returned,
		OnError:  warnAtMost(logger, h.clock, "units a region took from global may not have gone back; they return when the key's state in global lapses"),
	})
	if err != nil {
		return nil, err
	}
	return &region{store: store, global: global, pool: pool}, nil
}

package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// Lease reclaims: an instance that Redis refuses a key of a zone with
// local_quota asks the other instances, over Redis Pub/Sub, for the units
// they hold of it in leases, and every instance answers the requests for
// the zones it serves (redisstore.Reclaims, nearcache.Cache.ReturnNamed;
// docs/design.md "The near cache"). One redisstore.Reclaims serves every
// handler on the same Redis and prefix, as the runtime overrides do; each
// zone of each handler listens on it apart, so a request from one handler
// reaches the others of the process too (several sites may declare one
// zone, each with its own leases).
// Zones whose redis block has a global server do not reclaim (newLimit
// says why).

// redisReclaimSources pools the Reclaims of each Redis client and prefix.
var redisReclaimSources = caddy.NewUsagePool()

// pooledReclaims is a shared redisstore.Reclaims.
type pooledReclaims struct{ *redisstore.Reclaims }

// Destruct ends its subscriptions once no config uses it.
func (p pooledReclaims) Destruct() error { return p.Close() }

// loadReclaims opens h's shared Reclaims, once per handler.
func (h *Handler) loadReclaims() error {
	if h.reclaimsKey != "" {
		return nil
	}
	raw, err := json.Marshal([]any{h.redisKey, h.Redis.KeyPrefix})
	if err != nil {
		return fmt.Errorf("lease reclaims: %w", err)
	}
	key := string(raw)
	logger, clock, prefix := h.logger, h.clock, h.Redis.KeyPrefix
	client := h.redis.UniversalClient
	v, _, err := redisReclaimSources.LoadOrNew(key, func() (caddy.Destructor, error) {
		r, err := redisstore.NewReclaims(client, redisstore.ReclaimsOptions{
			Prefix:  prefix,
			OnError: warnAtMost(logger, clock, "instances could not ask each other for lease units through Redis; unspent units return when their leases lapse"),
		})
		if err != nil {
			return nil, err
		}
		return pooledReclaims{r}, nil
	})
	if err != nil {
		return fmt.Errorf("lease reclaims: %w", err)
	}
	h.reclaims, h.reclaimsKey = v.(pooledReclaims).Reclaims, key
	return nil
}

// releaseRedisReclaims releases a handler's use of its pooled Reclaims.
func releaseRedisReclaims(key string) {
	if key != "" {
		_, _ = redisReclaimSources.Delete(key)
	}
}

// askReclaim asks the zone's other handlers, in this process and in the
// other instances, for their leases of the key named name; nothing before
// the zone listens or after it stopped.
func (z *zone) askReclaim(name string) {
	if l := z.reclaims.Load(); l != nil {
		z.reclaimCounts.countAsked()
		l.Ask(name)
	}
}

// reclaimed returns what this instance holds in leases of the key another
// instance asked for, under every limit of the zone (its own, its tiers',
// its overrides'), each in the background.
func (z *zone) reclaimed(name string) {
	z.reclaimCounts.countHeard()
	for _, l := range z.limits() {
		if l.near == nil {
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), nearCloseTimeout)
			defer cancel()
			_ = l.near.ReturnNamed(ctx, name)
		}()
	}
}

package ratelimit

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// overridesLoadTimeout bounds how long provisioning waits for a zone's
// overrides from Redis; past it the zone starts without them and takes
// them when its subscription connects.
const overridesLoadTimeout = time.Second

// redisOverrideSet is a redis zone's overrides, shared through Redis.
type redisOverrideSet struct {
	ro   *redisstore.Overrides
	zone string
	t    *limiter.OverrideTable
}

func (s redisOverrideSet) table() *limiter.OverrideTable { return s.t }

func (s redisOverrideSet) put(ctx context.Context, key string, o limiter.Override, keep limiter.KeepGen) (limiter.Override, error) {
	return s.ro.SetGen(ctx, s.zone, key, o, keep)
}

func (s redisOverrideSet) remove(ctx context.Context, key string) (bool, error) {
	return s.ro.Delete(ctx, s.zone, key)
}

func (s redisOverrideSet) list(ctx context.Context, now time.Time) (map[string]limiter.Override, error) {
	all, err := s.ro.List(ctx, s.zone)
	for k, o := range all {
		if !o.Active(now) {
			delete(all, k)
		}
	}
	return all, err
}

// redisOverrides returns zone's overrides on h's Redis, loading them
// before the zone serves: an instance started after an override was set
// applies it from its first request.
func (h *Handler) redisOverrides(ctx caddy.Context, zone string) (overrideSet, error) {
	if h.overridesKey == "" {
		ro, key, err := loadRedisOverrides(h)
		if err != nil {
			return nil, err
		}
		h.overrides, h.overridesKey = ro, key
	}
	loadCtx, cancel := context.WithTimeout(ctx, overridesLoadTimeout)
	defer cancel()
	t, err := h.overrides.Zone(loadCtx, zone)
	h.overrideZones = append(h.overrideZones, zone)
	if err != nil {
		h.logger.Warn("a redis zone's runtime overrides could not be loaded; it starts without them and applies them once Redis answers",
			zap.String("zone", zone), zap.Error(err))
	}
	return redisOverrideSet{ro: h.overrides, zone: zone, t: t}, nil
}

// overrideChangedEverywhere gives back, in every zone of that name whose
// overrides come from Redis, what this instance leased for a key whose
// override another instance changed.
func overrideChangedEverywhere(zone, key string, logger *zap.Logger) {
	for _, reg := range zones.named(zone) {
		z := reg.zone
		if z.ov == nil || z.ov.set == nil {
			continue
		}
		if _, ok := z.ov.set.(redisOverrideSet); ok {
			z.overrideChanged(key, logger)
		}
	}
}

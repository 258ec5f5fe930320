package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// redisOverrideSources shares one redisstore.Overrides (its
// subscriptions and refreshes) among the handlers on one Redis client,
// key prefix and refresh interval, so a reload keeps them.
var redisOverrideSources = caddy.NewUsagePool()

// pooledOverrides is a shared redisstore.Overrides.
type pooledOverrides struct{ *redisstore.Overrides }

// Destruct stops its subscriptions once no config uses it.
func (p pooledOverrides) Destruct() error { return p.Close() }

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

// loadRedisOverrides returns the shared RedisOverrides of h's client,
// prefix, refresh and clock, with the key to release it by. Handlers on
// different clocks (tests' fake clocks) never share one: it judges what
// has lapsed on its handlers' clock.
func loadRedisOverrides(h *Handler) (*redisstore.Overrides, string, error) {
	cfg := h.Redis
	raw, err := json.Marshal([]any{h.redisKey, cfg.KeyPrefix, cfg.OverridesRefresh, clockID(h.clock)})
	if err != nil {
		return nil, "", fmt.Errorf("redis overrides: %w", err)
	}
	key := string(raw)
	logger, keys, clock := h.logger, h.keys, h.clock
	client := h.redis.UniversalClient
	v, _, err := redisOverrideSources.LoadOrNew(key, func() (caddy.Destructor, error) {
		var errorLogged atomic.Int64
		ro, err := redisstore.NewOverrides(client, redisstore.OverridesOptions{
			Prefix:  cfg.KeyPrefix,
			Refresh: time.Duration(cfg.OverridesRefresh),
			// What has lapsed is judged on the handlers' clock.
			Clock:    clock,
			OnChange: func(zone, key string) { overrideChangedEverywhere(zone, key, logger) },
			OnSkip: func(zone, key string, err error) {
				logger.Warn("a runtime override stored in Redis cannot be read; skipped",
					zap.String("zone", zone), zap.String("key_hash", keys.Hex(key)), zap.Error(err))
			},
			OnError: func(err error) {
				now := nowOn(clock).UnixNano()
				if last := errorLogged.Load(); now-last >= int64(failLogInterval) && errorLogged.CompareAndSwap(last, now) {
					logger.Warn("runtime overrides could not be read from Redis; changes apply once it answers", zap.Error(err))
				}
			},
		})
		if err != nil {
			return nil, err
		}
		return pooledOverrides{ro}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("redis overrides: %w", err)
	}
	return v.(pooledOverrides).Overrides, key, nil
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

// releaseRedisOverrides releases the zones a handler opened in ro, so a
// zone no config uses any more stops its subscription, and then ro itself
// by its pool key.
func releaseRedisOverrides(ro *redisstore.Overrides, key string, zones []string) {
	if ro != nil {
		for _, z := range zones {
			ro.Release(z)
		}
	}
	if key != "" {
		_, _ = redisOverrideSources.Delete(key)
	}
}

// clockIDs numbers the clocks handlers are given, for the keys of pooled
// sources: the system clock (nil) is 0.
var clockIDs = struct {
	sync.Mutex
	ids  map[limiter.Clock]int64
	next int64
}{ids: map[limiter.Clock]int64{}}

// clockID is c's number. A clock that cannot be a map key (its type is
// not comparable) gets a number of its own each time.
func clockID(c limiter.Clock) int64 {
	if c == nil {
		return 0
	}
	clockIDs.Lock()
	defer clockIDs.Unlock()
	if !reflect.TypeOf(c).Comparable() {
		clockIDs.next++
		return clockIDs.next
	}
	if id, ok := clockIDs.ids[c]; ok {
		return id
	}
	clockIDs.next++
	clockIDs.ids[c] = clockIDs.next
	return clockIDs.next
}

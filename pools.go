package ratelimit

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The process-wide pools, in one place: what handlers share across config
// reloads, how a handler acquires it in Provision and lets go of it in
// Cleanup. Each pool is a caddy.UsagePool (or, for the memory zones'
// overrides, a map kept for the process), keyed so that a reload that
// keeps a setting finds what the old config held:
//
//   - memoryStores: memory stores by zone state and policy;
//   - redisClients: Redis clients (with their breaker and clock) by the
//     redis block's resolved settings;
//   - redisOverrideSources: the Redis overrides subscriptions by client,
//     prefix, refresh and clock;
//   - memoryOverrideSets: the memory zones' overrides by zone name.

// memoryStores keeps memory stores across config reloads: a store is keyed
// by zone name and policy, so a reload that keeps both finds the old
// counters, and one that changes the policy starts afresh.
var memoryStores = caddy.NewUsagePool()

// pooledMemory lets a memory store live in a caddy.UsagePool.
type pooledMemory struct{ *limiter.Memory }

// Destruct implements caddy.Destructor; a memory store holds nothing but memory.
func (pooledMemory) Destruct() error { return nil }

// loadMemoryStore returns the memory store of the limit state (see
// limiter.StateID) under p, creating it if no running config holds it, and
// the key to release it by. A store is made with the clock of the handler
// that first needs it; stores are shared, so tests that set a clock use
// zone names of their own.
//
// A concurrency store is keyed by its state alone, and each policy decides
// through a view of it (limiter.Memory.Sharing): the requests a key has in
// flight are counted once, whichever of the zone's limits applies to them
// and across a reload that changes the limit.
func loadMemoryStore(state string, p limiter.Policy, maxKeys int, clock limiter.Clock) (*limiter.Memory, string, error) {
	shared := p.Algorithm.Traits().ReleasesOnFinish
	key := state + "\x00" + p.String()
	if shared {
		key = state + "\x00" + string(p.Algorithm)
	}
	v, loaded, err := memoryStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		m, err := limiter.NewMemory(p, limiter.MemoryOptions{MaxKeys: maxKeys, Clock: clock})
		if err != nil {
			return nil, err
		}
		return pooledMemory{m}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("memory store: %w", err)
	}
	m := v.(pooledMemory).Memory
	if loaded {
		m.SetMaxKeys(maxKeys)
	}
	if shared && m.Policy().String() != p.String() {
		if m, err = m.Sharing(p); err != nil {
			releaseMemoryStore(key)
			return nil, "", err
		}
	}
	return m, key, nil
}

func releaseMemoryStore(key string) {
	if key != "" {
		_, _ = memoryStores.Delete(key)
	}
}

// redisClients shares one client among every handler whose redis block
// resolves to the same settings, so a config reload that keeps the block
// keeps its connections, and the last config to let go closes it.
var redisClients = caddy.NewUsagePool()

// pooledRedis is a shared client, the breaker of the stores that use it
// (an outage or a recovery is the client's, not one zone's) and their
// clock (a server that refuses TIME in scripts refuses it to every zone).
type pooledRedis struct {
	redis.UniversalClient
	breaker *redisstore.Breaker
	clock   *redisstore.ServerClock
}

// Destruct closes the client once no config uses it.
func (p pooledRedis) Destruct() error { return p.Close() }

// storeOptions are the redisstore.Options of one policy of zone name (tier
// and override as for newLimit) on this client: its breaker and server
// clock, keys under prefix, each call bounded by timeout.
func (p pooledRedis) storeOptions(prefix string, timeout time.Duration, keys *limiter.KeyHasher, name, tier string, override bool) redisstore.Options {
	return redisstore.Options{
		Prefix:      prefix,
		Zone:        name,
		Tier:        tier,
		Override:    override,
		Timeout:     timeout,
		Breaker:     p.breaker,
		Keys:        keys,
		ServerClock: p.clock,
	}
}

// loadRedisClient returns the shared client for cfg, with its breaker and
// clock, and the key to release it by. The client connects lazily: an
// unreachable Redis does not stop Caddy from starting; the zones' fail
// modes apply until it answers. logger hears when the clock switches.
func loadRedisClient(cfg redisPoolKey, logger *zap.Logger) (pooledRedis, string, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return pooledRedis{}, "", fmt.Errorf("redis: %w", err)
	}
	key := string(raw)
	v, _, err := redisClients.LoadOrNew(key, func() (caddy.Destructor, error) {
		b, err := redisstore.NewBreakerWith(cfg.Breaker)
		if err != nil {
			return nil, err
		}
		c, err := cfg.Client.NewClient()
		if err != nil {
			return nil, err
		}
		return pooledRedis{c, b, redisstore.NewServerClock(c, func(instance bool) { logClockSwitch(logger, instance) })}, nil
	})
	if err != nil {
		return pooledRedis{}, "", fmt.Errorf("redis: %w", err)
	}
	return v.(pooledRedis), key, nil
}

// logClockSwitch says, once per switch, which clock the zones on a Redis
// now decide by.
func logClockSwitch(logger *zap.Logger, instance bool) {
	if instance {
		logger.Warn("this Redis refuses TIME inside scripts (AWS ElastiCache Serverless does): its zones now decide by each instance's own clock, so keep the instances' clocks in sync (NTP); skew between them moves window edges and refills by the skew")
		return
	}
	logger.Info("this Redis allows TIME inside scripts again: its zones decide by Redis's clock")
}

func releaseRedisClient(key string) {
	if key != "" {
		_, _ = redisClients.Delete(key)
	}
}

// redisOverrideSources shares one redisstore.Overrides (its
// subscriptions and refreshes) among the handlers on one Redis client,
// key prefix and refresh interval, so a reload keeps them.
var redisOverrideSources = caddy.NewUsagePool()

// pooledOverrides is a shared redisstore.Overrides.
type pooledOverrides struct{ *redisstore.Overrides }

// Destruct stops its subscriptions once no config uses it.
func (p pooledOverrides) Destruct() error { return p.Close() }

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
			OnError: warnAtMost(logger, clock, "runtime overrides could not be read from Redis; changes apply once it answers"),
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

// memoryOverrideSets keeps the memory zones' overrides by zone name for the
// life of the process, so a reload finds them as they were; each is also
// saved in Caddy's storage, so a restart does.
var memoryOverrideSets = struct {
	mu     sync.Mutex
	byName map[string]*memoryOverrides
}{byName: map[string]*memoryOverrides{}}

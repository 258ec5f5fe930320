package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwtauth"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests per zone. Each zone picks the
// requests it applies to (match), how they are grouped (key), and the limit
// and algorithm that bound each group. A request that exceeds any zone's
// limit is refused with HTTP 429 and consumes nothing from the other zones;
// when the server has `handle_errors` routes the refusal is returned to
// them as an error to render, else the 429 is written at once.
//
// Every response of a request that at least one zone evaluated carries
// `X-RateLimit-*` headers and the IETF `RateLimit` and `RateLimit-Policy`
// fields, unless `headers` names other families.
type Handler struct {
	// RateLimits are the zones, keyed by name. A zone's state (its
	// counters) is identified by its name and its limit: it survives a
	// config reload that keeps both, and two handlers that declare the
	// same zone name with the same limit share one set of counters.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Headers lists the families of rate-limit fields responses carry:
	// "x-ratelimit" (X-RateLimit-Limit, -Remaining, -Reset), "ietf"
	// (RateLimit and RateLimit-Policy with a member per zone), "draft-7"
	// (RateLimit: limit=, remaining=, reset= and RateLimit-Policy, of
	// draft-ietf-httpapi-ratelimit-headers-07), "draft-6" (RateLimit-Limit,
	// -Remaining, -Reset and RateLimit-Policy, of draft 6), or "none".
	// Families that write the same field cannot be combined, and "none"
	// combines with nothing. Default: ["x-ratelimit", "ietf"], which
	// "both" also names. A single name may be given as a string
	// ("headers": "ietf"), as before families could be combined.
	// Retry-After is part of every 429, whatever the families.
	Headers HeaderFamilies `json:"headers,omitempty"`

	// LogKey logs the raw key of each denied request. Off by default,
	// because keys can hold API keys or tokens.
	LogKey bool `json:"log_key,omitempty"`

	// KeySecret keys the hash that names client keys where they are
	// stored or shown without being kept (Redis key names, decision
	// samples, logs, the admin API's top): an HMAC-SHA256 under this
	// secret instead of a plain SHA-256, whose names of keys with little
	// entropy (an IPv4 address: at most 2^32 hashes) can be reversed. At
	// least 16 bytes; a placeholder such as {env.FLOODGATE_KEY_SECRET}
	// keeps it out of the config. Instances sharing a Redis must use the
	// same secret, and changing it starts every Redis key afresh.
	KeySecret string `json:"key_secret,omitempty"`

	// SweepInterval is how often the memory store forgets keys whose
	// state is back to empty. Default: 1m; at least 1s.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// MaxKeys bounds the keys the memory store keeps per zone; beyond it
	// the least recently used key is forgotten. Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	// Jitter adds up to this fraction of the wait to Retry-After (0.2
	// adds up to 20%), so refused clients do not all retry at once. From
	// 0 to 1.
	Jitter float64 `json:"jitter,omitempty"`

	// Redis is where zones with `store redis` keep their state.
	Redis *RedisConfig `json:"redis,omitempty"`

	// JWT verifies bearer tokens so zones can key on their claims
	// (`key jwt_claim sub`, `{jwt.sub}` in templates and tiers).
	JWT *JWTConfig `json:"jwt,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// LogSample logs this fraction of decisions (0 to 1, default 0),
	// chosen at random, at info level: zone, allowed, remaining, source
	// (memory, redis, lease, deny_cache, fallback, missing_key), duration
	// and the key's hash (the raw key with log_key).
	LogSample float64 `json:"log_sample,omitempty"`

	// Distributed is accepted for compatibility with
	// mholt/caddy-ratelimit and ignored with a warning: use a zone's
	// `store redis` to share limits between instances.
	Distributed json.RawMessage `json:"distributed,omitempty"`

	// StorageRaw is accepted for compatibility with
	// mholt/caddy-ratelimit and ignored with a warning, as Distributed.
	StorageRaw json.RawMessage `json:"storage,omitempty"`

	zones []*zone
	// remoteZones counts the zones whose store answers over the network:
	// with two or more, evaluate asks for their decisions together.
	remoteZones int
	headers     headerFamilies
	logger      *zap.Logger
	// debugDenials is set when the logger takes debug lines, which only a
	// config reload (a new Provision) changes: a refusal then logs nothing
	// without asking the logger, which costs a deep call per refusal.
	debugDenials bool
	sweeper      *sweeper
	jwt          *jwtauth.Verifier
	// redis is the shared client of the redis block, with its breaker, and
	// its pool key.
	redis    pooledRedis
	redisKey string
	// global is the shared client of the redis block's global block, with
	// its breaker, and its pool key; set only with that block.
	global    pooledRedis
	globalKey string
	// metrics are the metric families, nil under disable_metrics; set
	// before the zones are, which count regional refills into them.
	metrics *metricVecs
	// overrides are the runtime overrides of the handler's redis zones,
	// shared with every handler on the same Redis and prefix, released by
	// overridesKey.
	overrides    *redisstore.Overrides
	overridesKey string
	// overrideZones are the zone names the handler opened in overrides,
	// each released once when it is cleaned up.
	overrideZones []string
	// reclaims carry the requests of the instances for each other's
	// leases (reclaims.go), shared with every handler on the same Redis
	// and prefix, released by reclaimsKey.
	reclaims    *redisstore.Reclaims
	reclaimsKey string
	// clock is the handler's time source, and its memory stores' and
	// near caches' when it creates them; nil is the system clock. Set it
	// before Provision to step time in a test.
	clock limiter.Clock
	// keys names client keys (KeySecret); nil is the plain SHA-256.
	keys *limiter.KeyHasher
	// events emits rate_limit_exceeded on each refusal.
	events *eventEmitter
	// inflight counts the requests being served while there is a Redis
	// client, so Cleanup hands the client back only once they are done.
	inflight *inflight
}

// Zone is one rate limit.
type Zone struct {
	// MatcherSetsRaw selects the requests this zone applies to; empty
	// means every request the handler sees.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key groups requests: each distinct value has its own limit. Any
	// placeholders are allowed ("{http.request.header.X-API-Key}",
	// "{http.vars.client_ip}:{http.request.uri.path}"). Empty means the
	// client IP. A key without placeholders is one limit shared by every
	// request. Keys are hashed before they are stored.
	Key string `json:"key,omitempty"`

	// Algorithm is token_bucket, leaky_bucket, fixed_window,
	// sliding_window_log (default), sliding_window_counter or concurrency.
	Algorithm string `json:"algorithm,omitempty"`

	// MaxEvents is the quota: units per window (for concurrency, requests
	// in flight).
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is the period the quota applies to. For concurrency it
	// bounds how long a crashed instance's requests hold their slots in
	// Redis, as a slot lapses a window after its last renewal (default 1m).
	Window caddy.Duration `json:"window,omitempty"`

	// Calendar, instead of Window, makes a fixed_window zone's windows a
	// time zone's calendar days, weeks (from Monday) or months, so
	// max_events per month resets on the 1st at local midnight. A zone
	// with a calendar and no algorithm is a fixed_window zone.
	Calendar *CalendarConfig `json:"calendar,omitempty"`

	// Burst is the capacity of a token or leaky bucket. Default: max_events.
	Burst int64 `json:"burst,omitempty"`

	// Cost is how many units one request consumes: a whole number, or a
	// placeholder evaluated per request ("{http.request.header.X-Batch-Size}",
	// "{vars.cost}") whose value must be an integer from 0 to the limit's
	// quota, else the request is refused with 400. Default: 1.
	Cost Cost `json:"cost,omitempty"`

	// CountResponse counts only the requests whose response it matches
	// (Caddy's response matcher: status codes or classes, headers), such
	// as failed logins. A request still needs its cost to be available
	// and takes it up front, so parallel requests cannot overshoot; the
	// units are given back when the response does not match. Not for
	// concurrency or leaky_bucket.
	CountResponse *caddyhttp.ResponseMatcher `json:"count_response,omitempty"`

	// ResponseCost learns a request's real cost from its response: the
	// integer value of a header or trailer, such as the tokens an LLM API
	// used. See ResponseCost. Not for concurrency or leaky_bucket.
	ResponseCost *ResponseCost `json:"response_cost,omitempty"`

	// MaxDelay is, for leaky_bucket, the longest a request may be held to
	// space requests out. Default: (burst-1)/rate, which admits burst
	// requests at once.
	MaxDelay *caddy.Duration `json:"max_delay,omitempty"`

	// Store is "memory" (default: this instance only) or "redis" (shared
	// by every instance using the handler's redis block).
	Store string `json:"store,omitempty"`

	// Fail says what a redis zone does when Redis errs or does not answer
	// within its timeout: "open" (default) lets the request through with
	// no headers from this zone; "closed" answers 503 with Retry-After: 1;
	// "local" decides with an in-memory limit of the same policy on this
	// instance until Redis answers again.
	Fail string `json:"fail,omitempty"`

	// Tier picks the limit per request from a value, such as a plan set
	// by Caddy's `map` from an API key, or a JWT claim. Values not listed
	// use the zone's own limit. Each tier has counters of its own.
	Tier *Tier `json:"tier,omitempty"`

	// MissingKey says what happens when the key evaluates empty: "ip"
	// (default) limits the request by client IP instead, in a namespace of
	// its own; "deny" refuses it with 429; "skip" lets it through
	// unlimited by this zone.
	MissingKey string `json:"missing_key,omitempty"`

	// IPv4Prefix groups IPv4 clients: a key value that is an IPv4 address
	// is masked to this many bits. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups IPv6 clients, as IPv4Prefix. Default: 64, so
	// clients rotating through one /64 share a limit.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// DryRun decides, counts, logs and sets headers, but never refuses.
	DryRun bool `json:"dry_run,omitempty"`

	// Exceeded says what the zone does with a request over its limit:
	// "refuse" (default) answers 429; "pass" passes it on to the next
	// handler, taking nothing in this zone, with the placeholder
	// {http.rate_limit.exceeded.name} set to the zone's name, so that
	// later routes can send it elsewhere (a smaller model, a cached
	// answer) with Caddy's vars matcher. The other zones count the
	// request as any they admit, since it is served, and one of them may
	// still refuse it. The response's fields report this zone's state
	// (no Retry-After). A block override and missing_key deny still
	// refuse; under dry_run the zone passes nothing on.
	Exceeded string `json:"exceeded,omitempty"`

	// LocalQuota lets each instance take units of a redis zone's quota
	// from Redis ahead of requests (a lease) and spend them in memory, so
	// a busy key costs one round trip per lease instead of one per
	// request. A lease holds at most this fraction of the quota (0 to 1;
	// default 0, off) and lives at most a second, after which its unspent
	// units go back to Redis. Instances together never admit more than
	// the limit; see docs/near-cache.md. Only for store redis
	// with token_bucket, fixed_window, sliding_window_log or
	// sliding_window_counter.
	LocalQuota float64 `json:"local_quota,omitempty"`

	// DenyCache is, for a redis zone, the longest a key's refusal by
	// Redis is repeated from memory (with Retry-After counting down)
	// before Redis is asked again, so a flood of refused requests does
	// not reach Redis. Default: 1s; 0 (Caddyfile: off) turns it off. Not
	// for concurrency zones, whose slots free at any moment.
	DenyCache *caddy.Duration `json:"deny_cache,omitempty"`

	// usesJWTClaimKey records `key jwt_claim`, which needs a jwt block.
	usesJWTClaimKey bool
}

// Tier is a zone's per-request choice of limit.
type Tier struct {
	// Placeholder is evaluated per request, e.g. "{plan}" or "{jwt.plan}".
	Placeholder string `json:"placeholder"`
	// Limits maps a value to its limit.
	Limits map[string]TierLimit `json:"limits"`
}

// TierLimit is the quota of one tier; the zone's algorithm, cost and
// max_delay apply, and a bucket's burst is the tier's events.
type TierLimit struct {
	MaxEvents int64          `json:"max_events"`
	Window    caddy.Duration `json:"window,omitempty"`
	// Period, in a calendar zone and instead of Window, is the tier's
	// calendar window, "day", "week" or "month", in the zone's time zone.
	Period string `json:"period,omitempty"`
}

// CalendarConfig is a zone's calendar windows.
type CalendarConfig struct {
	// Period is "day", "week" (from Monday) or "month".
	Period string `json:"period"`
	// TimeZone is the IANA name of the time zone whose midnights begin
	// windows ("Europe/Berlin", "America/New_York"). Default: UTC.
	TimeZone string `json:"time_zone,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// useLogger makes l the handler's logger.
func (h *Handler) useLogger(l *zap.Logger) {
	h.logger = l
	h.debugDenials = l.Core().Enabled(zapcore.DebugLevel)
}

// Provision checks the config (see validate) and sets up the zones and
// their stores.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.useLogger(ctx.Logger())
	if err := h.validate(); err != nil {
		return err
	}
	if len(h.Distributed) > 0 || len(h.StorageRaw) > 0 {
		h.logger.Warn("the distributed and storage options of mholt/caddy-ratelimit are accepted but not used; set `store redis` on a zone to share its limit between instances")
	}
	h.headers, _ = parseHeaderFamilies(h.Headers)
	if h.JWT == nil {
		for name, z := range h.RateLimits {
			if strings.Contains(z.Key, "{jwt.") || (z.Tier != nil && strings.Contains(z.Tier.Placeholder, "{jwt.")) {
				h.logger.Warn("zone uses {jwt.*} placeholders but this rate_limit has no jwt block: they are empty unless another module provides them, and such requests follow missing_key",
					zap.String("zone", name))
			}
		}
	}
	events, err := newEventEmitter(ctx)
	if err != nil {
		return fmt.Errorf("loading the events app: %w", err)
	}
	h.events = events
	if h.keys, err = h.keyHasher(); err != nil {
		return err
	}
	if err := h.provisionShared(ctx); err != nil {
		h.releaseShared()
		return err
	}

	var metrics *metricVecs
	if !h.DisableMetrics {
		var err error
		if metrics, err = registerMetrics(ctx); err != nil {
			h.releaseShared()
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	h.metrics = metrics
	for _, name := range h.zoneNames() {
		z, err := h.provisionZone(ctx, name, h.RateLimits[name])
		if err != nil {
			h.releaseZones()
			h.releaseShared()
			return fmt.Errorf("zone %q: %w", name, err)
		}
		z.metrics = metrics.forZone(name, z.fail, z.limit.remote, z.responseCost != nil)
		// A memory decision takes well under the histogram's first
		// bucket (5 µs), so only zones that ask over the network are
		// timed for it; samples report every zone's duration.
		z.timed = (z.metrics != nil && z.limit.remote) || h.LogSample > 0
		h.zones = append(h.zones, z)
		if z.limit.remote {
			h.remoteZones++
		}
	}

	interval := time.Duration(h.SweepInterval)
	if interval <= 0 {
		interval = time.Minute
	}
	h.sweeper = startSweeper(interval, h.zones, h.logger)
	zones.add(h, ctx.Done())
	h.warmRedis()
	return nil
}

// validate refuses a config that cannot be enforced as written: each
// field is checked once, by the validate of the struct that defines it
// (Zone, RedisConfig, JWTConfig, or the handler's own here). It is not
// Caddy's Validate, which Caddy calls after Provision: Provision runs it
// first, before it opens a client, fetches a key set or resizes a memory
// store that the running config shares.
func (h *Handler) validate() error {
	if _, err := parseHeaderFamilies(h.Headers); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	if err := jitterBound.check(h.Jitter); err != nil {
		return err
	}
	if err := maxKeysBound.check(h.MaxKeys); err != nil {
		return err
	}
	if err := logSampleBound.check(h.LogSample); err != nil {
		return err
	}
	if err := sweepIntervalBound.check(h.SweepInterval); err != nil {
		return err
	}
	if len(h.RateLimits) == 0 {
		return errNoZone
	}
	if h.Redis != nil {
		if err := h.Redis.checkResolved(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		if err := h.Redis.validate(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
	}
	if h.JWT != nil {
		if err := h.JWT.validate(); err != nil {
			return fmt.Errorf("jwt: %w", err)
		}
	}
	for _, name := range h.zoneNames() {
		z := h.RateLimits[name]
		if z == nil {
			return fmt.Errorf("zone %q: empty", name)
		}
		if err := z.validate(name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		if err := h.zoneNeeds(z); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
	}
	return nil
}

// zoneNames lists the zones' names in order, so zones are set up, and a
// config with several faults refused, the same way every time.
func (h *Handler) zoneNames() []string {
	names := make([]string, 0, len(h.RateLimits))
	for name := range h.RateLimits {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// zoneNeeds refuses a zone that needs a block of the handler it lacks.
func (h *Handler) zoneNeeds(z *Zone) error {
	if z.Store == storeRedis && h.Redis == nil {
		return errors.New("store redis needs a redis block in this rate_limit")
	}
	if z.Store == storeRedis && h.Redis.Global != nil {
		if a := z.policy().Algorithm; !a.Traits().Leases {
			return fmt.Errorf("the redis block's global applies only to token_bucket, fixed_window, sliding_window_log and sliding_window_counter, not %s: a region cannot hold its units ahead of requests", a)
		}
	}
	return nil
}

// Cleanup stops the sweeper and lets go of the zones' stores, while the
// handler keeps limiting: Caddy cleans a replaced config up while its
// servers still finish the requests they were serving (see drain.go).
// Memory stores are only unreferenced, never emptied; the Redis client is
// handed back once the handler's requests are done, within a bound.
func (h *Handler) Cleanup() error {
	zones.remove(h)
	h.sweeper.stop()
	for _, z := range h.zones {
		z.release()
	}
	h.jwt.Close()
	if key := h.redisKey; key != "" {
		ov, ovKey, ovZones, recKey, globalKey := h.overrides, h.overridesKey, h.overrideZones, h.reclaimsKey, h.globalKey
		h.inflight.releaseWhenIdle(func() {
			releaseRedisOverrides(ov, ovKey, ovZones)
			releaseRedisReclaims(recKey)
			releaseRedisClient(key)
			releaseRedisClient(globalKey)
		})
	}
	return nil
}

// provisionShared opens what all zones share: the Redis client and the
// JWT verifier.
func (h *Handler) provisionShared(ctx caddy.Context) error {
	if h.Redis != nil {
		c, key, err := loadRedisClient(h.Redis.poolKey(), h.logger)
		if err != nil {
			return err
		}
		h.redis, h.redisKey = c, key
		h.inflight = new(inflight)
		if g := h.Redis.Global; g != nil {
			gc, gkey, err := loadRedisClient(g.poolKey(), h.logger.With(zap.String("redis", "global")))
			if err != nil {
				return fmt.Errorf("global: %w", err)
			}
			h.global, h.globalKey = gc, gkey
		}
	}
	if h.JWT != nil {
		v, err := h.JWT.newVerifier(ctx, h.logger)
		if err != nil {
			return fmt.Errorf("jwt: %w", err)
		}
		h.jwt = v
	}
	return nil
}

func (h *Handler) releaseShared() {
	h.jwt.Close()
	h.jwt = nil
	releaseRedisOverrides(h.overrides, h.overridesKey, h.overrideZones)
	releaseRedisReclaims(h.reclaimsKey)
	releaseRedisClient(h.redisKey)
	releaseRedisClient(h.globalKey)
	h.redis, h.redisKey = pooledRedis{}, ""
	h.global, h.globalKey = pooledRedis{}, ""
	h.overrides, h.overridesKey, h.overrideZones = nil, "", nil
	h.reclaims, h.reclaimsKey = nil, ""
}

func (h *Handler) releaseZones() {
	for _, z := range h.zones {
		z.release()
	}
	h.zones = nil
}

// Interface guards
var (
	_ caddy.Module                = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ limiter.Store               = (*limiter.Memory)(nil)
)

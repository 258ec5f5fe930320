package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/internal/hotkeys"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/nearcache"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// Zone option values.
const (
	storeMemory = "memory"
	storeRedis  = "redis"

	failOpen   = "open"
	failClosed = "closed"
	failLocal  = "local"

	missingIP   = "ip"
	missingDeny = "deny"
	missingSkip = "skip"

	exceededRefuse = "refuse"
	exceededPass   = "pass"
)

// zone is a provisioned Zone: its matchers, key and store.
type zone struct {
	name string
	// keys names client keys where they are shown hashed (the handler's
	// key_secret).
	keys     *limiter.KeyHasher
	matchers caddyhttp.MatcherSets
	key      keyTemplate
	missing  string
	// cost is every request's cost, unless costTemplate gives each its own.
	cost         int64
	costTemplate *keyTemplate
	// countResponse and responseCost settle a request's cost once its
	// response is known (see settle.go); watches is set when either is.
	countResponse *caddyhttp.ResponseMatcher
	responseCost  *ResponseCost
	watches       bool
	dryRun        bool
	// passExceeded is `exceeded pass`: a request over the limit is
	// passed on, not refused (decideRecord). Never set with dryRun,
	// which passes nothing on.
	passExceeded bool
	fail         string
	limit        limit
	// tierKey picks a tier's limit from tiers; requests whose value is
	// not listed use limit.
	tierKey *keyTemplate
	tiers   map[string]*limit
	// failLogged is when a store failure was last logged (Unix ns), so a
	// Redis outage logs a line every few seconds, not one per request.
	failLogged atomic.Int64
	metrics    *zoneMetrics
	// hot counts the keys the zone decides most, for the admin API's top.
	hot *hotkeys.Counter
	// timed is set when the zone's decisions are timed: for the
	// decision-time histogram or for samples.
	timed bool
	// exceeded is the error a denial wraps, made once.
	exceeded error
	// placeholder is the name boxed once for the replacer.
	placeholder any
	// ov is the zone's runtime overrides (see overrides.go); nil only in
	// tests that build zones by hand.
	ov *overrideRules
	// global names the global server of a zone shared across regions
	// (GlobalRedisConfig.server), "" for other zones.
	global      string
	regionQuota float64
	// clock is its handler's (Handler.clock; nil is the system clock):
	// every judgment of time about the zone's overrides (in force,
	// lapsed, swept) is made on it, on the request path, in the admin
	// API and rate_limit_status alike.
	clock limiter.Clock
	// reclaims is the zone's listening for other handlers' and
	// instances' requests for its leases, and its asking (reclaims.go);
	// nil when it does not listen, and then it asks nothing.
	reclaims atomic.Pointer[redisstore.ReclaimListener]
	// reclaimCounts counts its reclaims asked and heard; nil without
	// metrics or listening.
	reclaimCounts *reclaimCounters
}

// now is the time on the zone's handler's clock.
func (z *zone) now() time.Time { return nowOn(z.clock) }

// nowOn is the time on c, or on the system clock when c is nil.
func nowOn(c limiter.Clock) time.Time {
	if c == nil {
		return time.Now()
	}
	return c.Now()
}

// limit is a policy with its store and what the headers say about it.
type limit struct {
	policy limiter.Policy
	traits limiter.Traits
	// maxCost is the most one request may cost (policy.MaxCost), which a
	// per-request or reported cost is bounded by.
	maxCost int64
	store   limiter.Store
	// quotaText (in decimal, for X-RateLimit-Limit) and window are what
	// RateLimit-Policy reports; policyItem is that zone's member of the
	// field, made once.
	quotaText  string
	window     time.Duration
	policyItem string
	// calendar, for a calendar limit, makes its policyItem per window.
	calendar *calendarPolicy
	// fallback decides for a redis zone with `fail local` while Redis is away:
	// a memory store of the same policy on this instance.
	fallback limiter.Store
	// remote is set when store answers over the network, so a request
	// matching several such zones waits for their decisions together.
	remote bool
	// poolKeys name the memory stores this limit holds in memoryStores.
	poolKeys []string
	// redis is the limit's Redis store, behind near when there is one;
	// for a zone shared across regions, its store on the global server.
	redis *redisstore.Store
	// region is set for a zone shared across regions (the redis block's
	// global): its regional store, which store is or sits in front of.
	region *region
	// near is the redis store's near cache (leases, denial cache), which
	// release closes so its leases go back to Redis.
	near *nearcache.Cache
}

// policy builds the limiter policy the zone describes.
func (z *Zone) policy() limiter.Policy {
	p := limiter.Policy{
		Algorithm: limiter.Algorithm(z.Algorithm),
		Events:    z.MaxEvents,
		Window:    time.Duration(z.Window),
		Burst:     z.Burst,
	}
	if p.Algorithm == "" {
		p.Algorithm = limiter.SlidingWindowLog
		if z.Calendar != nil {
			p.Algorithm = limiter.FixedWindow
		}
	}
	p.Calendar = z.Calendar.calendar()
	if p.Window == 0 {
		p.Window = p.Algorithm.Traits().DefaultWindow
	}
	if z.MaxDelay != nil {
		d := time.Duration(*z.MaxDelay)
		p.MaxDelay = &d
	}
	return p
}

// validate refuses a zone that cannot be enforced as written. Its messages
// name the field, so the Caddyfile parser can report them at the zone's
// line. What its policy alone decides (a known algorithm, positive events
// and window, a burst and max_delay not negative, products that fit) is
// limiter.Policy.Validate's to say.
func (z *Zone) validate(name string) error {
	if err := validZoneName(name); err != nil {
		return err
	}
	if err := windowBound.check(z.Window); err != nil {
		return err
	}
	if err := z.validateCalendar(); err != nil {
		return err
	}
	p := z.policy()
	if err := p.Validate(); err != nil {
		return err
	}
	traits := p.Algorithm.Traits()
	if z.Burst != 0 && !traits.Bucket {
		return fmt.Errorf("burst applies only to token_bucket and leaky_bucket, not %s", p.Algorithm)
	}
	if z.MaxDelay != nil && !traits.HoldsRequests {
		return fmt.Errorf("max_delay applies only to leaky_bucket, not %s", p.Algorithm)
	}
	if z.MaxDelay != nil {
		if err := maxDelayBound.check(*z.MaxDelay); err != nil {
			return err
		}
	}
	c, err := z.Cost.constant()
	if err != nil {
		return err
	}
	if z.Cost.isTemplate() {
		if _, err := z.Cost.template(); err != nil {
			return err
		}
	} else if c > p.MaxCost() {
		return fmt.Errorf("cost %d exceeds what the zone can ever admit (%d): every request would be refused", c, p.MaxCost())
	}
	if err := z.validateResponseShaped(p); err != nil {
		return err
	}
	switch z.Store {
	case "", storeMemory:
		if z.Fail != "" {
			return fmt.Errorf("fail applies only to store redis")
		}
	case storeRedis:
	default:
		return fmt.Errorf("unknown store %q (want memory or redis)", z.Store)
	}
	switch z.Fail {
	case "", failOpen, failClosed, failLocal:
	default:
		return fmt.Errorf("unknown fail mode %q (want open, closed or local)", z.Fail)
	}
	if err := z.validateNearCache(traits); err != nil {
		return err
	}
	if err := z.validateTier(p); err != nil {
		return err
	}
	switch z.MissingKey {
	case "", missingIP, missingDeny, missingSkip:
	default:
		return fmt.Errorf("unknown missing_key %q (want ip, deny or skip)", z.MissingKey)
	}
	switch z.Exceeded {
	case "", exceededRefuse, exceededPass:
	default:
		return fmt.Errorf("unknown exceeded %q (want refuse or pass)", z.Exceeded)
	}
	if err := ipv4PrefixBound.check(z.IPv4Prefix); err != nil {
		return err
	}
	if err := ipv6PrefixBound.check(z.IPv6Prefix); err != nil {
		return err
	}
	if _, err := parseKeyTemplate(z.Key); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	return nil
}

// validateCalendar checks a calendar and that it is the zone's only
// window; which algorithms take one is the policy's to say.
func (z *Zone) validateCalendar() error {
	if z.Calendar == nil {
		return nil
	}
	if err := z.Calendar.validate(); err != nil {
		return fmt.Errorf("calendar: %w", err)
	}
	if z.Window != 0 {
		return errors.New("calendar replaces window: give one or the other")
	}
	return nil
}

// validateNearCache checks local_quota and deny_cache, which only a redis
// zone's near cache can use.
func (z *Zone) validateNearCache(traits limiter.Traits) error {
	if z.LocalQuota != 0 {
		if err := localQuotaBound.check(z.LocalQuota); err != nil {
			return err
		}
		switch {
		case z.Store != storeRedis:
			return fmt.Errorf("local_quota applies only to store redis: a memory zone decides in memory already")
		case !traits.Leases:
			return fmt.Errorf("local_quota applies only to token_bucket, fixed_window, sliding_window_log and sliding_window_counter, not %s", z.policy().Algorithm)
		}
	}
	if z.DenyCache != nil {
		if err := denyCacheBound.check(*z.DenyCache); err != nil {
			return err
		}
		switch {
		case z.Store != storeRedis:
			return fmt.Errorf("deny_cache applies only to store redis")
		case traits.ReleasesOnFinish && *z.DenyCache != 0:
			return fmt.Errorf("deny_cache does not apply to %s: its slots free whenever a request finishes", z.policy().Algorithm)
		}
	}
	return nil
}

// denyCache is how long a redis zone repeats a refusal from memory.
func (z *Zone) denyCache(traits limiter.Traits) time.Duration {
	switch {
	case traits.ReleasesOnFinish:
		return 0
	case z.DenyCache == nil:
		return defaultDenyCache
	}
	return time.Duration(*z.DenyCache)
}

// hotKeysCapacity is how many keys a zone's hot-key counter tracks: the
// admin API's top shows at most this many, and their counts are exact
// while a half minute sees no more distinct keys than this per shard.
const hotKeysCapacity = 128

// hotSeed hashes keys for the hot-key counters; seeded per process, so a
// client cannot choose keys that collide.
var hotSeed = maphash.MakeSeed()

// nearCloseTimeout bounds how long releasing a zone waits for its leases
// to go back to Redis.
const nearCloseTimeout = 2 * time.Second

// defaultDenyCache is how long a redis zone repeats a refusal by default:
// a flood from one key then costs Redis one script a second. A refusal is
// never repeated past its own Retry-After.
const defaultDenyCache = time.Second

// validateTier checks every tier's limit as the zone's own is checked.
func (z *Zone) validateTier(p limiter.Policy) error {
	if z.Tier == nil {
		return nil
	}
	if _, err := parseTierKey(z.Tier.Placeholder); err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	if len(z.Tier.Limits) == 0 {
		return fmt.Errorf("tier: %w", errNoTierValue)
	}
	c, _ := z.Cost.constant()
	vz := variantZone{policy: p, cost: c, perRequest: z.Cost.isTemplate()}
	for value, tl := range z.Tier.Limits {
		if err := tierVariant(tl).check(vz); err != nil {
			return fmt.Errorf("tier %q: %w", value, err)
		}
	}
	return nil
}

// errNoTierValue refuses a tier that lists no value, in the Caddyfile and
// in JSON alike.
var errNoTierValue = errors.New("list at least one <value> <n>/<duration>")

// parseTierKey compiles a tier's placeholder, refusing one that holds no
// placeholder: every request would then pick the same tier.
func parseTierKey(placeholder string) (keyTemplate, error) {
	k, err := parseKeyTemplate(placeholder)
	if err != nil || placeholder == "" || !strings.Contains(placeholder, "{") {
		return keyTemplate{}, fmt.Errorf("%q is not a placeholder such as {plan} or {jwt.plan}", placeholder)
	}
	return k, nil
}

// validateResponseShaped checks count_response and response_cost, which
// give units back or take more once the response is known: only the
// algorithms that count units taken, not those that hold requests or
// slots.
func (z *Zone) validateResponseShaped(p limiter.Policy) error {
	if z.CountResponse == nil && z.ResponseCost == nil {
		return nil
	}
	if !p.Algorithm.Traits().Charges {
		option := "count_response"
		if z.CountResponse == nil {
			option = "response_cost"
		}
		return fmt.Errorf("%s applies only to token_bucket, fixed_window, sliding_window_log and sliding_window_counter, not %s", option, p.Algorithm)
	}
	if z.CountResponse != nil {
		if err := validateCountResponse(z.CountResponse); err != nil {
			return err
		}
	}
	if z.ResponseCost != nil {
		return z.ResponseCost.validate()
	}
	return nil
}

// validZoneName refuses names that cannot be written as a structured-field
// String (RFC 9651): only printable ASCII is allowed.
func validZoneName(name string) error {
	if name == "" {
		return errors.New("a zone needs a name")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("zone name %q: only printable ASCII is allowed", name)
		}
	}
	return nil
}

func (h *Handler) provisionZone(ctx caddy.Context, name string, cfg *Zone) (*zone, error) {
	z := &zone{
		name:     name,
		clock:    h.clock,
		keys:     h.keys,
		missing:  cfg.MissingKey,
		dryRun:   cfg.DryRun,
		exceeded: fmt.Errorf("rate limit exceeded in zone %q", name),
		// A dry run changes nothing a request does, routes included.
		passExceeded: cfg.Exceeded == exceededPass && !cfg.DryRun,
	}
	z.placeholder = name
	if cfg.Store == storeRedis && h.Redis.Global != nil {
		z.global, z.regionQuota = h.Redis.Global.server(), h.Redis.Global.regionQuota()
	}
	var err error
	if z.cost, err = cfg.Cost.constant(); err != nil {
		return nil, err
	}
	if cfg.Cost.isTemplate() {
		if z.costTemplate, err = cfg.Cost.template(); err != nil {
			return nil, err
		}
	}
	z.countResponse = cfg.CountResponse
	if cfg.ResponseCost != nil {
		rc := *cfg.ResponseCost
		rc.field = http.CanonicalHeaderKey(rc.Header)
		rc.trailerField = http.TrailerPrefix + rc.field
		z.responseCost = &rc
	}
	z.watches = z.countResponse != nil || z.responseCost != nil
	z.hot = hotkeys.New(hotKeysCapacity, h.clock)
	if z.missing == "" {
		z.missing = missingIP
	}
	z.fail = cfg.Fail
	if z.fail == "" {
		z.fail = failOpen
	}
	if cfg.MatcherSetsRaw != nil {
		sets, err := ctx.LoadModule(cfg, "MatcherSetsRaw")
		if err != nil {
			return nil, fmt.Errorf("loading matchers: %w", err)
		}
		if err := z.matchers.FromInterface(sets); err != nil {
			return nil, fmt.Errorf("loading matchers: %w", err)
		}
	}
	if z.key, err = parseKeyTemplate(cfg.Key); err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	z.key.ipv4Bits, z.key.ipv6Bits = cfg.IPv4Prefix, cfg.IPv6Prefix
	if z.key.ipv4Bits == 0 {
		z.key.ipv4Bits = 32
	}
	if z.key.ipv6Bits == 0 {
		z.key.ipv6Bits = 64
	}
	p := cfg.policy()
	if z.limit, err = h.newLimit(z, "", false, cfg, p); err != nil {
		z.release()
		return nil, err
	}
	if err := h.provisionOverrides(ctx, z, cfg); err != nil {
		z.release()
		return nil, err
	}
	if cfg.Tier != nil {
		tk, err := parseTierKey(cfg.Tier.Placeholder)
		if err != nil {
			z.release()
			return nil, fmt.Errorf("tier: %w", err)
		}
		tk.ipv4Bits, tk.ipv6Bits = 32, 128
		z.tierKey, z.tiers = &tk, make(map[string]*limit, len(cfg.Tier.Limits))
		for value, tl := range cfg.Tier.Limits {
			l, err := h.newLimit(z, value, false, cfg, tierPolicy(p, tl))
			if err != nil {
				z.release()
				return nil, fmt.Errorf("tier %q: %w", value, err)
			}
			z.tiers[value] = &l
		}
	}
	if h.reclaims != nil && cfg.Store == storeRedis && cfg.LocalQuota > 0 {
		z.reclaimCounts = h.metrics.forReclaims(name)
		z.reclaims.Store(h.reclaims.Listen(name, z.reclaimed))
	}
	return z, nil
}

// newLimit opens the stores of one policy of a zone: the zone's own
// (tier ""), a tier's or, with override, one of its override limits',
// whose states are always kept apart.
func (h *Handler) newLimit(z *zone, tier string, override bool, cfg *Zone, p limiter.Policy) (limit, error) {
	name := z.name
	q, w := p.Quota()
	l := limit{policy: p, traits: p.Algorithm.Traits(), maxCost: p.MaxCost(), quotaText: strconv.FormatInt(q, 10), window: w, policyItem: policyItem(name, p)}
	if p.Calendar != nil {
		l.calendar = &calendarPolicy{name: name, policy: p}
	}
	state := limiter.StateID(name, tier)
	if override {
		state = limiter.OverrideStateID(name)
	}
	if l.traits.ReleasesOnFinish {
		// A concurrency key has one set of requests in flight, whatever
		// limit counts them: every limit of the zone counts in the
		// zone's own state (limiter.Memory.Sharing; the Redis store
		// names it so too).
		state = limiter.StateID(name, "")
	}
	if cfg.Store != storeRedis {
		mem, key, err := loadMemoryStore(state, p, h.MaxKeys, h.clock)
		if err != nil {
			return limit{}, err
		}
		l.store, l.poolKeys = mem, []string{key}
		return l, nil
	}
	var leaser limiter.Leaser
	// keyName names a key among the instances for lease reclaims
	// (reclaims.go); nil, no reclaims. A regional zone reclaims nothing:
	// its store refuses only once global has refused the region, and its
	// pool then repeats that refusal for up to a quarter lifetime
	// whatever comes back (limiter/regional), so the refused instance,
	// asking again after nearcache.ReclaimDeny, would be refused again
	// and the region's other instances would lose their leases for it;
	// their units would go to global, to whichever region asks first;
	// and the units other regions hold, most of what a region is short
	// of, are beyond its Redis's Pub/Sub. Reclaiming across regions
	// would need the pool to lift its refusal when units come back and
	// regions to reclaim batches over global. Refills ahead and sizing
	// by demand apply to a regional zone as to any store a near cache
	// leases from.
	var keyName func(string) string
	if h.Redis.Global != nil {
		r, err := h.newRegion(name, tier, override, p)
		if err != nil {
			return limit{}, fmt.Errorf("regional store: %w", err)
		}
		l.region, l.redis, l.remote = r, r.global, true
		l.store, leaser = r.store, r.store
	} else {
		rs, err := h.newRedisStore(name, tier, override, p)
		if err != nil {
			return limit{}, fmt.Errorf("redis store: %w", err)
		}
		l.store, l.redis, l.remote = rs, rs, true
		leaser, keyName = rs, rs.Key
	}
	if deny := cfg.denyCache(l.traits); cfg.LocalQuota > 0 || deny > 0 {
		logger := h.logger.With(zap.String("zone", name))
		opts := nearcache.Options{
			LeaseFraction: cfg.LocalQuota,
			DenyFor:       deny,
			MaxKeys:       h.MaxKeys,
			Clock:         h.clock,
			OnGiveBackError: func(err error) {
				logger.Warn("unspent lease units could not be returned to Redis; they return when the key's state expires", zap.Error(err))
			},
		}
		if cfg.LocalQuota > 0 && keyName != nil {
			// Refused a key, ask the other instances for its leases
			// (reclaims.go).
			if err := h.loadReclaims(); err != nil {
				return limit{}, err
			}
			opts.Reclaim = z.askReclaim
			opts.Name = keyName
		}
		near, err := nearcache.New(leaser, p, opts)
		if err != nil {
			if l.region != nil {
				_ = l.region.store.Close(context.Background())
			}
			return limit{}, fmt.Errorf("near cache: %w", err)
		}
		l.store, l.near = near, near
	}
	if cfg.Fail == failLocal {
		mem, key, err := loadMemoryStore(state+"\x00local", p, h.MaxKeys, h.clock)
		if err != nil {
			return limit{}, err
		}
		l.fallback, l.poolKeys = mem, []string{key}
	}
	return l, nil
}

// newRedisStore opens the Redis store of one policy of zone name (tier
// and override as for newLimit) on the redis block's server.
func (h *Handler) newRedisStore(name, tier string, override bool, p limiter.Policy) (*redisstore.Store, error) {
	opts := h.redis.storeOptions(h.Redis.KeyPrefix, time.Duration(h.Redis.Timeout), h.keys, name, tier, override)
	opts.OnRenewError = func(err error) {
		h.logger.Warn("concurrency slots of requests in flight could not be renewed in Redis; two failures in a row and they lapse", zap.String("zone", name), zap.Error(err))
	}
	return redisstore.New(h.redis.UniversalClient, p, opts)
}

// limits lists the zone's own limit, its tiers' and those built for its
// overrides.
func (z *zone) limits() []*limit {
	ls := []*limit{&z.limit}
	for _, l := range z.tiers {
		ls = append(ls, l)
	}
	return append(ls, z.overrideLimits()...)
}

// release lets go of what provisionZone acquired: leases go back to Redis
// (within nearCloseTimeout), memory stores to their pool. The zone still
// decides afterwards, as Caddy may route requests on old connections to a
// handler after its Cleanup.
func (z *zone) release() {
	if l := z.reclaims.Load(); l != nil {
		l.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), nearCloseTimeout)
	defer cancel()
	for _, l := range z.limits() {
		if l.near != nil {
			_ = l.near.Close(ctx)
		}
		if l.region != nil {
			// After the near cache, whose leases go back into the
			// region's units: the region's units go back to global.
			_ = l.region.store.Close(ctx)
		}
		for _, key := range l.poolKeys {
			releaseMemoryStore(key)
		}
		l.poolKeys = nil
	}
}

// memories lists the zone's memory stores, for the sweeper.
func (z *zone) memories() []*limiter.Memory {
	var mems []*limiter.Memory
	for _, l := range z.limits() {
		for _, s := range []limiter.Store{l.store, l.fallback} {
			if m, ok := s.(*limiter.Memory); ok {
				mems = append(mems, m)
			}
		}
	}
	return mems
}

// storeUp reports whether the zone's stores decide: false while a redis
// zone's breaker has stopped asking Redis.
func (z *zone) storeUp() bool {
	for _, l := range z.limits() {
		if l.redis != nil && !l.redis.Up() {
			return false
		}
		if l.region != nil && !l.region.pool.Up() {
			return false
		}
	}
	return true
}

// instanceClock reports whether the zone's Redis refuses TIME in scripts,
// so its stores decide by this instance's clock (redisstore.ServerClock).
func (z *zone) instanceClock() bool {
	l := &z.limit
	return (l.redis != nil && l.redis.InstanceClock()) || (l.region != nil && l.region.pool.InstanceClock())
}

// keysHeld is how many keys the zone's memory stores hold (its own limit's
// and its tiers'), or its near caches' for a redis zone.
func (z *zone) keysHeld() int {
	n := 0
	for _, l := range z.limits() {
		switch s := l.store.(type) {
		case *limiter.Memory:
			n += s.Len()
		case *nearcache.Cache:
			n += s.Len()
		}
	}
	return n
}

// sortTiers orders tiers by value, so listings are stable.
func sortTiers(ts []tierInfo) {
	slices.SortFunc(ts, func(a, b tierInfo) int { return strings.Compare(a.Value, b.Value) })
}

package ratelimit

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Zone option values.
const (
	storeMemory = "memory"

	missingIP   = "ip"
	missingDeny = "deny"
	missingSkip = "skip"
)

// defaultConcurrencyLease is the window of a concurrency zone that sets none.
const defaultConcurrencyLease = time.Minute

// zone is a provisioned Zone: its matchers, key and store.
type zone struct {
	name     string
	matchers caddyhttp.MatcherSets
	key      keyTemplate
	missing  string
	cost     int64
	dryRun   bool
	limit    limit
	// exceeded is the error a denial wraps, made once.
	exceeded error
	// placeholder is the name boxed once for the replacer.
	placeholder any
}

// limit is a policy with its store and what the headers say about it.
type limit struct {
	policy limiter.Policy
	store  limiter.Store
	// quota and window are what RateLimit-Policy reports; policyItem is
	// that zone's member of the field, made once.
	quota      int64
	window     time.Duration
	policyItem string
	// poolKey names the store in memoryStores; empty for other stores.
	poolKey string
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
	}
	if p.Algorithm == limiter.Concurrency && p.Window == 0 {
		p.Window = defaultConcurrencyLease
	}
	if z.MaxDelay != nil {
		d := time.Duration(*z.MaxDelay)
		p.MaxDelay = &d
	}
	return p
}

// validate refuses a zone that cannot be enforced as written. Its messages
// name the field, so the Caddyfile parser can report them at the zone's line.
func (z *Zone) validate(name string) error {
	if err := validZoneName(name); err != nil {
		return err
	}
	p := z.policy()
	if !p.Algorithm.Known() {
		return fmt.Errorf("unknown algorithm %q (want one of %v)", z.Algorithm, limiter.Algorithms)
	}
	if z.MaxEvents <= 0 {
		return fmt.Errorf("events must be a positive number of events per window, got %d", z.MaxEvents)
	}
	if z.Window <= 0 && p.Algorithm != limiter.Concurrency {
		return fmt.Errorf("window must be a positive duration")
	}
	if z.Burst != 0 && p.Algorithm != limiter.TokenBucket && p.Algorithm != limiter.LeakyBucket {
		return fmt.Errorf("burst applies only to token_bucket and leaky_bucket, not %s", p.Algorithm)
	}
	if z.Burst < 0 {
		return fmt.Errorf("burst must be positive, got %d", z.Burst)
	}
	if z.MaxDelay != nil && p.Algorithm != limiter.LeakyBucket {
		return fmt.Errorf("max_delay applies only to leaky_bucket, not %s", p.Algorithm)
	}
	if z.Cost < 0 {
		return fmt.Errorf("cost must be positive, got %d", z.Cost)
	}
	if c := z.cost(); c > p.MaxCost() {
		return fmt.Errorf("cost %d exceeds what the zone can ever admit (%d): every request would be refused", c, p.MaxCost())
	}
	switch z.Store {
	case "", storeMemory:
	default:
		return fmt.Errorf("unknown store %q (want memory)", z.Store)
	}
	switch z.MissingKey {
	case "", missingIP, missingDeny, missingSkip:
	default:
		return fmt.Errorf("unknown missing_key %q (want ip, deny or skip)", z.MissingKey)
	}
	if z.IPv4Prefix < 0 || z.IPv4Prefix > 32 {
		return fmt.Errorf("ipv4_prefix must be between 1 and 32, got %d", z.IPv4Prefix)
	}
	if z.IPv6Prefix < 0 || z.IPv6Prefix > 128 {
		return fmt.Errorf("ipv6_prefix must be between 1 and 128, got %d", z.IPv6Prefix)
	}
	if _, err := parseKeyTemplate(z.Key); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	if err := p.Validate(); err != nil {
		return err
	}
	return nil
}

func (z *Zone) cost() int64 {
	if z.Cost == 0 {
		return 1
	}
	return z.Cost
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
		missing:  cfg.MissingKey,
		cost:     cfg.cost(),
		dryRun:   cfg.DryRun,
		exceeded: fmt.Errorf("rate limit exceeded in zone %q", name),
	}
	z.placeholder = name
	if z.missing == "" {
		z.missing = missingIP
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
	var err error
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
	if z.limit, err = h.newLimit(name, cfg.policy()); err != nil {
		return nil, err
	}
	return z, nil
}

// newLimit opens the store of one policy of a zone.
func (h *Handler) newLimit(name string, p limiter.Policy) (limit, error) {
	q, w := p.Quota()
	l := limit{policy: p, quota: q, window: w, policyItem: policyItem(name, p)}
	mem, key, err := loadMemoryStore(name, p, h.MaxKeys)
	if err != nil {
		return limit{}, err
	}
	l.store, l.poolKey = mem, key
	return l, nil
}

// release gives back what provisionZone acquired.
func (z *zone) release() {
	releaseMemoryStore(z.limit.poolKey)
}

// memories lists the zone's memory stores, for the sweeper.
func (z *zone) memories() []*limiter.Memory {
	if m, ok := z.limit.store.(*limiter.Memory); ok {
		return []*limiter.Memory{m}
	}
	return nil
}

package ratelimit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/nearcache"
)

// overrideSet is where one zone name's overrides are kept and changed:
// this instance's memory and Caddy's storage for a memory zone
// (memoryOverrides), Redis for a redis zone (redisOverrides). The admin API
// is its only writer. Its overrides are named as limiter.OverrideTable
// names them: a key's by the key, a prefix's by
// limiter.PrefixOverrideName.
type overrideSet interface {
	// table is the set as the request path reads it.
	table() *limiter.OverrideTable
	put(ctx context.Context, name string, o limiter.Override, keep limiter.KeepGen) (limiter.Override, error)
	remove(ctx context.Context, name string) (bool, error)
	// list is the set as its store holds it, those lapsed by now (on
	// the asking handler's clock) left out.
	list(ctx context.Context, now time.Time) (map[string]limiter.Override, error)
}

// maxOverrideLimits bounds how many distinct override limits one zone
// builds stores for: each is a store (and for a redis zone with
// local_quota, a near cache) of its own. Overrides beyond it that need a
// new limit are refused when set, and decided by the zone's own limit if
// another instance set them.
const maxOverrideLimits = 1000

// blockRetry is how long a block without an expiry tells a client to wait:
// it is asked again after an hour, and refused again.
const blockRetry = time.Hour

// overrideRules is a zone's overrides as its requests see them.
type overrideRules struct {
	set overrideSet
	// table is set.table(), which is the set's for its life: kept here so
	// a request does not ask the set for it.
	table *limiter.OverrideTable
	// newLimit builds a store for an override's policy, as the zone's
	// handler builds its tiers' (Handler.newLimit), with state of its own.
	newLimit func(p limiter.Policy) (limit, error)
	// block is what a blocked key's headers report: a quota of 0.
	block limit

	// limits are the stores built for override limits, by their quota:
	// read without a lock on every request under an override, replaced
	// (under mu) when one is added.
	limits atomic.Pointer[map[overrideQuota]*limit]
	mu     sync.Mutex
	// failLogged limits the log of overrides that cannot be applied.
	failLogged time.Time
}

// use makes set the zone's overrides, keeping its table beside it.
func (ov *overrideRules) use(set overrideSet) {
	ov.set, ov.table = set, set.table()
}

// provisionOverrides gives z its overrides: a memory zone's from this
// process (or Caddy's storage), a redis zone's from Redis.
func (h *Handler) provisionOverrides(ctx caddy.Context, z *zone, cfg *Zone) error {
	name := z.name
	z.ov = &overrideRules{
		newLimit: func(p limiter.Policy) (limit, error) { return h.newLimit(z, "", true, cfg, p) },
		block:    blockLimit(name, &z.limit),
	}
	if cfg.Store == storeRedis {
		set, err := h.redisOverrides(ctx, name)
		if err != nil {
			return err
		}
		z.ov.use(set)
		return nil
	}
	z.ov.use(loadMemoryOverrides(ctx, name, h.keys, h.now(), h.logger))
	z.buildOverrideLimits()
	return nil
}

// buildOverrideLimits builds the limits of the overrides z holds when it
// is provisioned, as its own limit and its tiers' are: a reload then
// takes over their memory stores from the config it replaces, keeping
// the state of keys under overrides as it keeps every other key's. (Built
// on first use instead, they would be made afresh once the replaced
// config had let go of them.) A limit that cannot be built is left to the
// request path, which logs it.
func (z *zone) buildOverrideLimits() {
	now := z.now()
	for _, o := range z.ov.set.table().Snapshot() {
		if o.Action == limiter.OverrideLimit && o.Active(now) {
			_, _ = z.overrideLimit(o)
		}
	}
}

// keepGen is what a write of o at now asks of the key's override in
// force, to keep its Gen (limiter.KeepGen): the same limit, as each of
// zones makes it with its own policy (the memory pool and the Redis key
// names tell limits apart so, and {"limit": 2} is {"limit": 2, "window":
// "1h"} in a zone of an hour), so the key's state carries on when only
// the expiry changes, and starts afresh whenever its limit changes (from
// the zone's or a tier's, from another override's, back to an earlier
// one, or after a delete). The store decides where it writes, so two
// writers at once never each start the key afresh.
func keepGen(zones []*zone, o limiter.Override, now time.Time) limiter.KeepGen {
	return func(old limiter.Override) bool {
		if !old.Active(now) || old.Action != limiter.OverrideLimit || o.Action != limiter.OverrideLimit {
			return false
		}
		for _, z := range zones {
			if overrideVariant(&old).policy(z.limit.policy).String() != overrideVariant(&o).policy(z.limit.policy).String() {
				return false
			}
		}
		return true
	}
}

// overrideStateKey is the name of key's state under its override limit
// o: its StateKey, except in a zone whose limit's state is the requests
// in flight (concurrency), which give their slots back when they finish:
// started afresh, that state would forget them and admit more than the
// limit while they run, so it keeps the key's name. A zone whose redis
// block has `global` keeps it too: each region has its own set of
// overrides, and each region's write of an override draws its own Gen,
// so states named by it would be one count per region in global, each
// admitting the whole limit. Named by the key alone under the override
// limit's store (whose Redis keys name the limit's policy), the override
// is one limit across the regions, as the zone's own is; setting the same
// limit again carries on its count rather than starting afresh, as a
// reload that keeps a zone's limit does (docs/design.md, "Regions").
func (z *zone) overrideStateKey(key string, o *limiter.Override) string {
	if z.limit.traits.ReleasesOnFinish || z.limit.region != nil {
		return key
	}
	return o.StateKey(key)
}

// overrideQuota is what of an OverrideLimit makes its policy: the key of
// its limit among the zone's, found without formatting a policy.
type overrideQuota struct {
	events, burst int64
	window        time.Duration
	period        limiter.Period
}

func quotaOfOverride(o limiter.Override) overrideQuota {
	return overrideQuota{events: o.Events, burst: o.Burst, window: o.Window, period: o.Period}
}

// lookup returns key's own override, lapsed or not (the caller asks
// Active); zone.overrideOf is what applies to it, a prefix's included. A
// zone without overrides of keys pays one atomic load.
func (st *overrideRules) lookup(key string) (limiter.Override, bool) {
	if st == nil {
		return limiter.Override{}, false
	}
	return st.set.table().Lookup(key)
}

// overrideLimit is the limit an OverrideLimit decides by: one store per
// distinct quota, built on first use and kept while the zone lives.
func (z *zone) overrideLimit(o limiter.Override) (*limit, error) {
	k := quotaOfOverride(o)
	st := z.ov
	if m := st.limits.Load(); m != nil {
		if l := (*m)[k]; l != nil {
			return l, nil
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.built()
	if l := old[k]; l != nil {
		return l, nil
	}
	if len(old) >= maxOverrideLimits {
		return nil, fmt.Errorf("zone %q already has %d distinct override limits", z.name, maxOverrideLimits)
	}
	// What the admin API refuses is never applied, whoever wrote it (a
	// record in Redis by hand, or by another build): the key is then
	// decided by its tier or zone.
	if err := z.checkOverride(o); err != nil {
		return nil, fmt.Errorf("zone %q cannot apply an override of %d per %v: %w", z.name, o.Events, o.Window, err)
	}
	l, err := st.newLimit(overrideVariant(&o).policy(z.limit.policy))
	if err != nil {
		return nil, err
	}
	m := make(map[overrideQuota]*limit, len(old)+1)
	maps.Copy(m, old)
	m[k] = &l
	st.limits.Store(&m)
	return &l, nil
}

// built is the override limits built so far.
func (st *overrideRules) built() map[overrideQuota]*limit {
	if m := st.limits.Load(); m != nil {
		return *m
	}
	return nil
}

// overrideLimits lists the limits built for overrides.
func (z *zone) overrideLimits() []*limit {
	if z.ov == nil {
		return nil
	}
	return slices.Collect(maps.Values(z.ov.built()))
}

// checkOverride refuses an override z cannot enforce, with a message for
// the admin API's 400: a limit's quota is checked as a tier's is
// (variant.check), and the zone may build only so many override limits.
func (z *zone) checkOverride(o limiter.Override) error {
	if err := o.Check(); err != nil {
		return err
	}
	if o.Action != limiter.OverrideLimit {
		return nil
	}
	vz := variantZone{name: z.name, policy: z.limit.policy, cost: z.cost, perRequest: z.costTemplate != nil, remote: z.limit.remote}
	if err := overrideVariant(&o).check(vz); err != nil {
		return err
	}
	if z.ov != nil {
		built := z.ov.built()
		if built[quotaOfOverride(o)] == nil && len(built) >= maxOverrideLimits {
			return fmt.Errorf("zone %q already has %d distinct override limits: reuse one of them", z.name, maxOverrideLimits)
		}
	}
	return nil
}

// overrideChanged returns what this instance leased for the keys of
// override name (a key, or every key under a prefix's
// limiter.PrefixOverrideName) under any of the zone's limits, once its
// override was set, changed or removed: units leased under one limit are
// never spent under another. The returns run off the caller's path.
func (z *zone) overrideChanged(name string, logger *zap.Logger) {
	var nears []*nearcache.Cache
	for _, l := range z.limits() {
		if l.near != nil {
			nears = append(nears, l.near)
		}
	}
	if len(nears) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), nearCloseTimeout)
		defer cancel()
		prefix, isPrefix := limiter.OverridePrefix(name)
		for _, n := range nears {
			var err error
			if isPrefix {
				err = n.ReturnLeasesWithPrefix(ctx, prefix)
			} else {
				err = n.ReturnLease(ctx, name)
			}
			if err != nil && logger != nil {
				logger.Warn("leases of a key whose override changed could not be returned to Redis; they return when its state expires",
					zap.String("zone", z.name), zap.Error(err))
			}
		}
	}()
}

// blockLimit is what a blocked key's headers report for zone name: a quota
// of 0 per blockRetry.
func blockLimit(name string, zl *limit) limit {
	p := zl.policy
	p.Calendar = nil
	return limit{
		policy: p, traits: zl.traits,
		quotaText:  "0",
		window:     blockRetry,
		policyItem: formatPolicyItem(name, p, 0, blockRetry),
	}
}

// blockFor is how long a blocked key is told to wait at now: until its
// override lapses, or blockRetry when that is later or never.
func blockFor(o limiter.Override, now time.Time) time.Duration {
	if o.Expires.IsZero() {
		return blockRetry
	}
	return min(blockRetry, o.Expires.Sub(now))
}

// logOverrideFailure logs, at most every failLogInterval per zone, an
// override that could not be applied: its key is then decided by the
// zone's own limit.
func (z *zone) logOverrideFailure(logger *zap.Logger, err error) {
	z.ov.mu.Lock()
	now := z.now()
	due := now.Sub(z.ov.failLogged) >= failLogInterval
	if due {
		z.ov.failLogged = now
	}
	z.ov.mu.Unlock()
	if due && logger != nil {
		logger.Warn("an override's limit cannot be applied; its key is decided by the zone's own limit", zap.String("zone", z.name), zap.Error(err))
	}
}

// overrideView is an override as the admin API shows it: a key's, or
// a prefix's.
type overrideView struct {
	Key string `json:"key,omitempty"`
	// Prefix is set instead of Key for a prefix override, which applies
	// to every key that starts with it.
	Prefix string `json:"prefix,omitempty"`
	Action string `json:"action"`
	Limit  int64  `json:"limit,omitempty"`
	// Window is the override's own window ("1h0m0s", or a calendar
	// period), absent when it takes the zone's.
	Window string `json:"window,omitempty"`
	Burst  int64  `json:"burst,omitempty"`
	// Expires is when it lapses (RFC 3339), and ExpiresIn the seconds
	// left; both absent for an override that never lapses.
	Expires   string  `json:"expires,omitempty"`
	ExpiresIn float64 `json:"expires_in,omitempty"`
}

// viewOverride shows o, kept under name (a key, or a prefix's
// limiter.PrefixOverrideName), at now.
func viewOverride(name string, o limiter.Override, now time.Time) overrideView {
	v := overrideView{Key: name, Action: o.Action.String(), Limit: o.Events, Burst: o.Burst}
	if p, ok := limiter.OverridePrefix(name); ok {
		v.Key, v.Prefix = "", p
	}
	switch {
	case o.Period != "":
		v.Window = string(o.Period)
	case o.Window != 0:
		v.Window = o.Window.String()
	}
	if !o.Expires.IsZero() {
		v.Expires = o.Expires.UTC().Format(time.RFC3339Nano)
		v.ExpiresIn, _ = strconv.ParseFloat(strconv.FormatFloat(o.Expires.Sub(now).Seconds(), 'f', 3, 64), 64)
	}
	return v
}

// overrideCount is how many overrides the zone holds.
func (z *zone) overrideCount() int {
	if z.ov == nil || z.ov.set == nil {
		return 0
	}
	return z.ov.set.table().Len()
}

// sweepOverrides removes the zone's overrides (keys' and prefixes') that
// lapsed by now on its handler's clock, giving back what their keys
// leased under them.
func (z *zone) sweepOverrides(logger *zap.Logger) {
	if z.ov == nil || z.ov.set == nil {
		return
	}
	for _, name := range z.ov.set.table().RemoveExpired(z.now()) {
		z.overrideChanged(name, logger)
	}
}

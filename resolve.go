package ratelimit

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// This file says, once, what applies to a key in a zone: which limit and
// state decide it (its override's, its tier's or the zone's own), or
// whether it is blocked, exempt, or missing. The request path
// (Handler.match), the admin API's inspect and reset, and
// rate_limit_status all ask zone.resolve, so they never disagree; and it
// derives (variant.policy) and checks (variant.check) the policy of a
// tier and of an override limit alike.

// verdict is what a zone does with a request, its key resolved.
type verdict uint8

const (
	// verdictDecide: the key's state (resolution.state) under
	// resolution.limit decides.
	verdictDecide verdict = iota
	// verdictBlock: the key's override blocks it: refused whatever it
	// would cost, told to wait resolution.wait.
	verdictBlock
	// verdictExempt: the key's override exempts it: the zone decides
	// nothing and writes none of its fields.
	verdictExempt
	// verdictDeny: the key is missing and the zone refuses such requests
	// (missing_key deny).
	verdictDeny
	// verdictSkip: the key is missing and the zone does not apply
	// (missing_key skip).
	verdictSkip
)

// resolution is what applies to one key of a zone at one time.
type resolution struct {
	verdict verdict
	// limit decides the key (verdictDecide); under a block it is the
	// block's, which the headers report (a quota of 0). Otherwise it is
	// the tier's or the zone's own, the key's limit had it no override.
	limit *limit
	// key is the key the zone names the request by: the one given, or
	// for a missing key under missing_key ip the client's IP in the
	// missing-key namespace; "" when missing under deny or skip.
	key string
	// state is the name of key's state in limit's store: key, or under
	// an override limit its StateKey (zone.overrideStateKey).
	state string
	// wait is how long a blocked key is told to wait.
	wait time.Duration
	// until is when the key's override limit lapses (zero: never, or no
	// override limit).
	until time.Time
	// override is the key's override in force at at, when inForce: its
	// own, or prefix's when prefix is not "".
	override limiter.Override
	inForce  bool
	prefix   string
	// failed is why override, a limit, cannot be applied (its limit
	// cannot be built): the key is then decided as if it had none.
	failed error
	// at is the time the override was judged at; zero when the key has
	// none (and the caller gave no time).
	at time.Time
}

// resolve is what applies in z to key at time at. found is false when
// the request's key is missing: missing_key then decides, and under ip
// (the default) the key is r's client IP in the missing-key namespace (r
// is read for nothing else, and may be nil when found). tier is the
// value of the zone's tier placeholder ("" when it has none or it is
// missing): a listed value picks its tier's limit, any other the zone's.
// A key's override in force at at decides before its tier, its tier
// before the zone (see overrideOf for which override). A zero at is now
// on the zone's handler's clock, read only when the key has an override,
// so a request without one reads no clock. It allocates nothing but an
// override limit's state name.
func (z *zone) resolve(key string, found bool, tier string, r *http.Request, at time.Time) resolution {
	var res resolution
	z.resolveTo(&res, key, found, tier, r, at)
	return res
}

// resolveTo is resolve writing into res, a zero resolution: the request
// path's form, since a resolution is some 250 bytes that a return by
// value zeroes and copies again on every request.
func (z *zone) resolveTo(res *resolution, key string, found bool, tier string, r *http.Request, at time.Time) {
	res.limit = z.tierLimit(tier)
	if !found {
		switch z.missing {
		case missingSkip:
			res.verdict = verdictSkip
			return
		case missingDeny:
			res.verdict = verdictDeny
			return
		}
		key = missingKeyNamespace + z.key.clientIP(r)
	}
	res.key, res.state = key, key
	ok := z.overrideOf(res, key, &at)
	res.at = at
	if !ok {
		return
	}
	o := &res.override
	switch o.Action {
	case limiter.OverrideExempt:
		res.verdict = verdictExempt
	case limiter.OverrideBlock:
		res.verdict, res.limit, res.wait = verdictBlock, &z.ov.block, max(time.Millisecond, blockFor(*o, at))
	default:
		l, err := z.overrideLimit(*o)
		if err != nil {
			res.failed = err
			return
		}
		res.limit, res.state, res.until = l, z.overrideStateKey(key, o), o.Expires
	}
}

// overrideName is the name of the override in force (see inForce): the
// key's, or its prefix's.
func (res *resolution) overrideName() string {
	if res.prefix != "" {
		return limiter.PrefixOverrideName(res.prefix)
	}
	return res.key
}

// overrideOf finds key's override in force at *at and, reporting
// whether there is one, sets res's override, inForce and prefix (the
// prefix it is set for, "" for the key's own): the key's own beats the
// longest prefix of the key that has one. One that has lapsed but is not
// yet swept is passed over for the next: the key's own for its longest
// prefix's, a prefix's for a shorter one's. *at is read (a zero one set
// to now on the zone's handler's clock) only once an override is found,
// lapsed or not: a key without one reads no clock, and a zone without
// any overrides pays one atomic load for them.
func (z *zone) overrideOf(res *resolution, key string, at *time.Time) bool {
	if z.ov == nil {
		return false
	}
	t := z.ov.table
	if t.Len() == 0 {
		return false
	}
	o, ok := t.Lookup(key)
	prefix, most := "", len(key)
	if !ok {
		if prefix, o, ok = t.LongestPrefix(key, most); !ok {
			return false
		}
	}
	if at.IsZero() {
		*at = z.now()
	}
	for !o.Active(*at) {
		if prefix != "" {
			most = len(prefix) - 1
		}
		if prefix, o, ok = t.LongestPrefix(key, most); !ok {
			return false
		}
	}
	res.override, res.inForce, res.prefix = o, true, prefix
	return true
}

// tierValue is the value of z's tier placeholder for r, or "" when the
// zone has no tiers or the value is missing.
func (z *zone) tierValue(r *http.Request, repl *caddy.Replacer, claims *jwtClaims) string {
	if z.tierKey == nil {
		return ""
	}
	if v, ok := z.tierKey.evaluate(r, repl, claims); ok {
		return v
	}
	return ""
}

// tierLimit is the limit tier value v picks: its tier's, or the zone's
// own for a value no tier lists.
func (z *zone) tierLimit(v string) *limit {
	if v == "" {
		return &z.limit // no tier, or its value missing: no map to ask
	}
	if l := z.tiers[v]; l != nil {
		return l
	}
	return &z.limit
}

// variant is the quota of a tier or an override limit: what of its
// zone's policy it replaces.
//
// The two differ in what they leave out, as docs/reference.md ("Tiers") and
// docs/admin-api.md ("Runtime overrides") document: a
// tier gives its whole quota, so its window (or, in a calendar zone, its
// period) is the one written and a bucket's burst is the tier's events,
// whatever the zone's burst; an override gives what the operator set,
// and a window, period or burst it leaves out (0, "") is the zone's.
// (A tier of 1000/1m in a token_bucket zone with burst 20 holds 1000
// tokens; an override {"limit": 1000} there holds 20.) override says
// which rule applies.
type variant struct {
	events int64
	window time.Duration
	period limiter.Period
	burst  int64
	// override is set for an override's quota (see above).
	override bool
}

// tierVariant is a tier's quota.
func tierVariant(tl TierLimit) variant {
	return variant{events: tl.MaxEvents, window: time.Duration(tl.Window), period: limiter.Period(tl.Period)}
}

// overrideVariant is an override limit's quota.
func overrideVariant(o *limiter.Override) variant {
	return variant{events: o.Events, window: o.Window, period: o.Period, burst: o.Burst, override: true}
}

// tierPolicy is the zone's policy p with tier tl's quota.
func tierPolicy(p limiter.Policy, tl TierLimit) limiter.Policy {
	return tierVariant(tl).policy(p)
}

// policy is p, its zone's policy, with v's quota: the algorithm and
// max_delay stay, and a calendar zone's variant keeps its time zone.
func (v variant) policy(p limiter.Policy) limiter.Policy {
	p.Events = v.events
	if v.burst != 0 || !v.override {
		p.Burst = v.burst
	}
	switch {
	case !v.override:
		p.Window = v.window
	case p.Calendar == nil && v.window != 0:
		p.Window = v.window
	}
	if p.Calendar != nil && (v.period != "" || !v.override) {
		p.Calendar = &limiter.Calendar{Period: v.period, Location: p.Calendar.Location}
	}
	return p
}

// variantZone is what checking a variant needs of its zone.
type variantZone struct {
	// name is the zone's, for the messages.
	name string
	// policy is the zone's own.
	policy limiter.Policy
	// cost is every request's cost; perRequest is set when each request
	// gives its own instead (a placeholder), checked as it comes.
	cost       int64
	perRequest bool
	// remote is set for a redis zone whose variant limits are checked
	// against the Redis scripts' exactness bounds here. (A tier's Redis
	// store checks its policy itself when it is opened, redisstore.New.)
	remote bool
}

// check refuses a variant z cannot enforce, as the zone's own limit is
// checked: its window must be of the zone's kind (a duration, or in a
// calendar zone a period) and within bounds, the policy it makes must be
// valid and admit the zone's cost, and a remote one must be exact in
// Redis. The messages name a tier's or an override's fields as each is
// written.
func (v variant) check(z variantZone) error {
	if err := v.checkKind(z); err != nil {
		return err
	}
	if err := windowBound.check(caddy.Duration(v.window)); err != nil {
		return err
	}
	vp := v.policy(z.policy)
	if err := vp.Validate(); err != nil {
		return err
	}
	if !z.perRequest && z.cost > vp.MaxCost() {
		if v.override {
			return fmt.Errorf("the zone's cost %d exceeds what this limit can ever admit (%d)", z.cost, vp.MaxCost())
		}
		return fmt.Errorf("cost %d exceeds what the tier can ever admit (%d)", z.cost, vp.MaxCost())
	}
	if z.remote {
		// The Redis scripts' exactness bounds (redisstore.New).
		if err := redisstore.CheckPolicy(vp); err != nil {
			return err
		}
	}
	return nil
}

// checkKind refuses a variant whose window is not of its zone's kind: a
// calendar zone's count per day, week or month (in the zone's time zone),
// any other zone's per a duration; and a burst where the zone's
// algorithm has none.
func (v variant) checkKind(z variantZone) error {
	cal := z.policy.Calendar
	if v.override {
		switch {
		case v.burst != 0 && !z.policy.Algorithm.Traits().Bucket:
			return fmt.Errorf("burst applies only to token_bucket and leaky_bucket, not %s", z.policy.Algorithm)
		case cal != nil && v.window != 0:
			return fmt.Errorf("zone %q counts per calendar %s: give the window as day, week or month", z.name, cal.Period)
		case cal == nil && v.period != "":
			return fmt.Errorf("zone %q is not a calendar zone: give the window as a duration such as 1h", z.name)
		}
		return nil
	}
	switch {
	case cal == nil && v.period != "":
		return fmt.Errorf("a period (%s) needs a calendar zone: give this zone a calendar, or the tier a duration such as 1000/1h", v.period)
	case cal != nil && (v.period == "" || v.window != 0):
		return fmt.Errorf("a calendar zone's tiers count per calendar day, week or month: write <n>/%s", cal.Period)
	case v.period != "":
		return validPeriod(string(v.period))
	}
	return nil
}

// The request path's resolve phase (see request.go).

// resolveZones records every zone that applies to r, in name order, with
// its key, limit, state and cost, asking no store: resolution stops at a
// record refused without asking (a missing key under missing_key deny, an
// override's block), as no zone after it is decided.
func (h *Handler) resolveZones(r *http.Request, repl *caddy.Replacer, req *request) error {
	for _, z := range h.zones {
		rec := req.nextRecord()
		ok, err := h.match(z, r, repl, req.claims, rec)
		if err != nil {
			return err
		}
		if !ok && rec.phase != undecided {
			req.dropLast()
			continue
		}
		if rec.phase == blocked && !z.dryRun {
			break
		}
	}
	return nil
}

// match reports whether zone z applies to r and, if so, sets c to it with
// its limit, key and cost; a zone that applies but decides nothing is
// reported as not applying, with c undecided. claims are the request's
// verified token, or nil. c is a zero record (request.nextRecord), whose
// fields match sets one by one: the record is large, and writing it whole
// costs more than the decision's other steps.
func (h *Handler) match(z *zone, r *http.Request, repl *caddy.Replacer, claims *jwtClaims, c *zoneRecord) (bool, error) {
	if len(z.matchers) > 0 {
		ok, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return false, caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if !ok {
			return false, nil
		}
	}
	tier := z.tierValue(r, repl, claims)
	key, ok := z.key.evaluate(r, repl, claims)
	// Override, then tier, then the zone's own limit, on the handler's
	// clock (the zone's).
	var res resolution
	z.resolveTo(&res, key, ok, tier, r, time.Time{})
	c.zone, c.limit, c.key, c.state, c.until = z, res.limit, res.key, res.state, res.until
	if res.inForce {
		c.noted.override, c.noted.overrideErr = res.override.Action, res.failed
	}
	switch res.verdict {
	case verdictSkip:
		c.phase = undecided
		return false, nil
	case verdictDeny:
		c.phase = blocked
		return true, nil
	case verdictExempt:
		// Not limited: the zone writes none of its fields, and counts the
		// request allowed when its turn comes (zoneRecord.count).
		c.phase, c.noted.exempt = undecided, true
		return false, nil
	case verdictBlock:
		c.phase, c.wait = blocked, res.wait
		return true, nil // refused whatever it would cost
	}
	if err := h.requestCost(r, repl, claims, c); err != nil {
		if !z.dryRun {
			return false, err
		}
		// dry_run never refuses: the 400 is logged (requestCost) and
		// counted as a refusal the zone would have made when its turn
		// comes, and the zone does not apply to this request.
		c.phase, c.noted.badCost = undecided, true
		return false, nil
	}
	return true, nil
}

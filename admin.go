package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/nearcache"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI serves the rate limiter's routes on Caddy's admin endpoint, so
// they obey the admin listener's own access controls:
//
//	GET    /rate_limit/zones                      every zone of the running config
//	GET    /rate_limit/zones/<zone>?key=<key>     a key's state, consuming nothing
//	DELETE /rate_limit/zones/<zone>?key=<key>     forget a key's state
//	GET    /rate_limit/zones/<zone>/top?n=10      the keys seen most in the last minute
//	GET    /rate_limit/zones/<zone>/overrides[?key=<key>]  the zone's runtime overrides
//	PUT    /rate_limit/zones/<zone>/overrides?key=<key>    set one (body: see overrideBody)
//	DELETE /rate_limit/zones/<zone>/overrides?key=<key>    remove one
//
// The overrides routes take ?prefix=<p> instead of ?key=<key> for the
// override of every key that starts with p.
//
// `tier=<value>` picks a tier's limit. docs/admin-api.md shows each with
// its answer. Caddy loads every admin.api module by itself:
// nothing needs configuring.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// adminPrefix starts every route of the API.
const adminPrefix = "/rate_limit/"

// Routes implements caddy.AdminRouter.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// serveAdmin routes a request of the API by its path, whose zone segment is
// URL-encoded (zone names may hold '/').
func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), adminPrefix+"zones")
	if !ok {
		return adminError(http.StatusNotFound, "no such route: %s", r.URL.Path)
	}
	if rest == "" || rest == "/" {
		if r.Method != http.MethodGet {
			return adminError(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return writeJSON(w, listZones())
	}
	segs := strings.Split(strings.TrimPrefix(rest, "/"), "/")
	name, err := url.PathUnescape(segs[0])
	if err != nil {
		return adminError(http.StatusBadRequest, "zone name %q: %v", segs[0], err)
	}
	found := zones.named(name)
	if len(found) == 0 {
		return adminError(http.StatusNotFound, "no zone %q in the running config", name)
	}
	switch {
	case len(segs) == 1 && r.Method == http.MethodGet:
		return inspectKey(w, r, found)
	case len(segs) == 1 && r.Method == http.MethodDelete:
		return resetKey(w, r, found)
	case len(segs) == 2 && segs[1] == "top" && r.Method == http.MethodGet:
		return topKeys(w, r, found)
	case len(segs) == 2 && segs[1] == "overrides":
		return serveOverrides(w, r, name, found)
	case len(segs) == 1 || (len(segs) == 2 && segs[1] == "top"):
		return adminError(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
	}
	return adminError(http.StatusNotFound, "no such route: %s", r.URL.Path)
}

// zoneInfo is a zone as GET /rate_limit/zones lists it.
type zoneInfo struct {
	Zone      string  `json:"zone"`
	Algorithm string  `json:"algorithm"`
	Store     string  `json:"store"`
	Limit     int64   `json:"limit"`
	Window    float64 `json:"window"`
	// Keys is how many keys the zone holds in memory; memory zones only.
	Keys *int `json:"keys,omitempty"`
	// StoreUp is false while a redis zone's breaker has stopped asking
	// Redis; memory zones are always up.
	StoreUp bool `json:"store_up"`
	// Clock is what a redis zone's decisions are timed by: "redis" (the
	// server's TIME) or "instance" (this instance's clock, on a server
	// that refuses TIME in scripts).
	Clock string `json:"clock,omitempty"`
	// Global names the global server of a zone shared across regions
	// (the redis block's global): its url without password or options,
	// or its addresses; RegionQuota is the most of a key's quota this
	// region holds at once. StoreUp is then false while either the
	// region's Redis or global is skipped by its breaker.
	Global      string     `json:"global,omitempty"`
	RegionQuota float64    `json:"region_quota,omitempty"`
	Tiers       []tierInfo `json:"tiers,omitempty"`
}

// tierInfo is one tier of a zone.
type tierInfo struct {
	Value  string  `json:"value"`
	Limit  int64   `json:"limit"`
	Window float64 `json:"window"`
}

// The values of zoneInfo.Clock.
const (
	clockRedis    = "redis"
	clockInstance = "instance"
)

func listZones() []zoneInfo {
	out := []zoneInfo{}
	for _, reg := range zones.all() {
		z := reg.zone
		info := zoneInfo{
			Zone:      z.name,
			Algorithm: string(z.limit.policy.Algorithm),
			Store:     storeMemory,
			StoreUp:   z.storeUp(),
		}
		info.Limit, info.Window = quotaOf(&z.limit)
		if z.limit.remote {
			info.Store, info.Clock = storeRedis, clockRedis
			if z.instanceClock() {
				info.Clock = clockInstance
			}
			if z.global != "" {
				info.Global, info.RegionQuota = z.global, z.regionQuota
			}
		} else {
			n := z.keysHeld()
			info.Keys = &n
		}
		for value, l := range z.tiers {
			ti := tierInfo{Value: value}
			ti.Limit, ti.Window = quotaOf(l)
			info.Tiers = append(info.Tiers, ti)
		}
		sortTiers(info.Tiers)
		out = append(out, info)
	}
	return out
}

func quotaOf(l *limit) (int64, float64) {
	q, w := l.policy.Quota()
	return q, w.Seconds()
}

// keyReport is a key's state as inspect answers it.
type keyReport struct {
	Zone       string  `json:"zone"`
	Tier       string  `json:"tier,omitempty"`
	Key        string  `json:"key"`
	Limit      int64   `json:"limit"`
	Remaining  int64   `json:"remaining"`
	ResetAfter float64 `json:"reset_after"`
	// Override is the key's override in force, which the state is of:
	// its own limit's, or a block's (limit 0, reset_after the wait), or an
	// exemption's (no limit: the numbers are 0).
	Override *overrideView `json:"override,omitempty"`
	// Region is, for a zone shared across regions, the key's units in this
	// region and its count in global; Remaining above counts both.
	Region *regionReport `json:"region,omitempty"`
}

// regionReport is a key of a zone shared across regions as inspect
// answers it: the batch of units this region holds (spendable for
// LapsesAfter seconds more), how long the region still repeats global's
// refusal, and global's own count.
type regionReport struct {
	Units            int64   `json:"units"`
	LapsesAfter      float64 `json:"lapses_after"`
	DeniedFor        float64 `json:"denied_for,omitempty"`
	GlobalRemaining  int64   `json:"global_remaining"`
	GlobalResetAfter float64 `json:"global_reset_after"`
}

// keyQuery reads the key and tier of an inspect or reset.
func keyQuery(r *http.Request) (key, tier string, err error) {
	q := r.URL.Query()
	if !q.Has("key") || q.Get("key") == "" {
		return "", "", adminError(http.StatusBadRequest, "the key query parameter is required: ?key=<the key as the zone sees it, URL-encoded>")
	}
	return q.Get("key"), q.Get("tier"), nil
}

// checkTier refuses a tier value z lists no tier for ("" is the zone's
// own limit).
func checkTier(z *zone, tier string) error {
	if tier == "" || z.tiers[tier] != nil {
		return nil
	}
	return adminError(http.StatusBadRequest, "zone %q has no tier %q", z.name, tier)
}

// inspectKey answers a key's state as the zone's requests find it
// (zone.resolve): under its override in force, else the limit of the
// query's tier.
func inspectKey(w http.ResponseWriter, r *http.Request, found []registered) error {
	return forKey(w, r, found, func(z *zone, key, tier string) (keyReport, error) {
		res := z.resolve(key, true, tier, nil, time.Time{})
		st := keyReport{Zone: z.name, Tier: tier, Key: key}
		if res.inForce && res.failed == nil {
			v := viewOverride(res.overrideName(), res.override, res.at)
			st.Override = &v
		}
		switch res.verdict {
		case verdictExempt:
			return st, nil
		case verdictBlock:
			st.ResetAfter = res.wait.Seconds()
			return st, nil
		}
		l, state := res.limit, res.state
		d, err := l.store.Peek(r.Context(), state)
		if err != nil {
			return st, err
		}
		st.Limit, _ = l.policy.Quota()
		st.Remaining, st.ResetAfter = d.Remaining, d.ResetAfter.Seconds()
		if l.region != nil {
			in, err := l.region.store.Inspect(r.Context(), state)
			if err != nil {
				return st, err
			}
			st.Region = &regionReport{
				Units: in.Units, LapsesAfter: in.Lapses.Seconds(), DeniedFor: in.Denied.Seconds(),
				GlobalRemaining: in.Global.Remaining, GlobalResetAfter: in.Global.ResetAfter.Seconds(),
			}
		}
		return st, nil
	})
}

// forKey answers a route about one key (inspect; resetKey does the same
// in two passes): do runs with the query's tier (checked: a zone must
// list it) in each zone of that name, with the key as that zone's
// requests name it (a full IP address masked to the zone's prefix, see
// keyTemplate.typed), and the answers are written as one, or as an array
// for a name several handlers declare.
func forKey[T any](w http.ResponseWriter, r *http.Request, found []registered, do func(z *zone, key, tier string) (T, error)) error {
	key, tier, err := keyQuery(r)
	if err != nil {
		return err
	}
	out := make([]T, 0, len(found))
	for _, reg := range found {
		if err := checkTier(reg.zone, tier); err != nil {
			return err
		}
		v, err := do(reg.zone, reg.zone.key.typed(key), tier)
		if err != nil {
			return adminError(http.StatusBadGateway, "zone %q: %v", reg.zone.name, err)
		}
		out = append(out, v)
	}
	return writeOneOrAll(w, out)
}

// keyReset is a key's reset as reset answers it.
type keyReset struct {
	Zone  string `json:"zone"`
	Tier  string `json:"tier,omitempty"`
	Key   string `json:"key"`
	Reset bool   `json:"reset"`
}

// resetKey forgets a key in the zone's store and its `fail local`
// fallback, under the limit the query's tier picks and under the key's
// override limit, when it has one; reset is true only if any held state
// for it (a lease or cached refusal of the near cache counts).
//
// When several handlers declare the zone, this is one reset for all of
// them: every near cache forgets the key before the first store's reset
// and again after the last (nearcache.Cache.StartReset). Reset one after
// another, a handler whose reset had ended could lease units from the
// state between two stores' resets and spend them after the reset, on
// top of the fresh limit.
func resetKey(w http.ResponseWriter, r *http.Request, found []registered) error {
	key, tier, err := keyQuery(r)
	if err != nil {
		return err
	}
	for _, reg := range found {
		if err := checkTier(reg.zone, tier); err != nil {
			return err
		}
	}
	// target is one store's state to reset, of the zone found[zone];
	// near is its near cache's reset once started.
	type target struct {
		s     limiter.Store
		state string
		zone  int
		near  *nearcache.Resetting
	}
	var targets []target
	out := make([]keyReset, len(found))
	type cacheState struct {
		c     *nearcache.Cache
		state string
	}
	started := map[cacheState]bool{}
	// end ends every near cache's reset (a second End does nothing):
	// once every store has been reset, or on the way out of a failure.
	end := func() {
		for _, t := range targets {
			if t.near != nil {
				t.near.End()
			}
		}
	}
	defer end()
	for i, reg := range found {
		z := reg.zone
		k := z.key.typed(key)
		out[i] = keyReset{Zone: z.name, Tier: tier, Key: k}
		l := z.tierLimit(tier)
		add := func(s limiter.Store, state string) {
			if s == nil {
				return
			}
			t := target{s: s, state: state, zone: i}
			if c, ok := s.(*nearcache.Cache); ok {
				// Once per cache and state: its reset holds a lock.
				if started[cacheState{c, state}] {
					return
				}
				started[cacheState{c, state}] = true
				t.near = c.StartReset(state)
			}
			targets = append(targets, t)
		}
		add(l.store, k)
		add(l.fallback, k)
		if res := z.resolve(k, true, tier, nil, time.Time{}); res.verdict == verdictDecide && res.limit != l {
			// The key's override limit.
			add(res.limit.store, res.state)
			add(res.limit.fallback, res.state)
		}
	}
	for _, t := range targets {
		var had bool
		if t.near != nil {
			had, err = t.near.ResetStore(r.Context())
		} else {
			had, err = t.s.Reset(r.Context(), t.state)
		}
		if err != nil {
			return adminError(http.StatusBadGateway, "zone %q: %v", found[t.zone].zone.name, err)
		}
		out[t.zone].Reset = out[t.zone].Reset || had
	}
	end()
	return writeOneOrAll(w, out)
}

// zoneTop is a zone's hottest keys as top answers them.
type zoneTop struct {
	Zone string   `json:"zone"`
	Keys []hotKey `json:"keys"`
}

// hotKey is one of them: its hash, or the key itself under log_key.
type hotKey struct {
	Key      string `json:"key"`
	Requests uint64 `json:"requests"`
	Denied   uint64 `json:"denied"`
}

// topKeys answers the zone's hottest keys.
func topKeys(w http.ResponseWriter, r *http.Request, found []registered) error {
	n := 10
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 1000 {
			return adminError(http.StatusBadRequest, "n must be a whole number from 1 to 1000, got %q", s)
		}
		n = v
	}
	var out []zoneTop
	for _, reg := range found {
		t := zoneTop{Zone: reg.zone.name, Keys: []hotKey{}}
		for _, e := range reg.zone.hot.Top(n) {
			k := reg.zone.keys.Hex(e.Key)
			if reg.logKey {
				k = e.Key
			}
			t.Keys = append(t.Keys, hotKey{Key: k, Requests: e.Requests, Denied: e.Denied})
		}
		out = append(out, t)
	}
	return writeOneOrAll(w, out)
}

// writeOneOrAll writes the answer of the one zone of that name, or of all
// of them as an array when several handlers declare it.
func writeOneOrAll[T any](w http.ResponseWriter, out []T) error {
	if len(out) == 1 {
		return writeJSON(w, out[0])
	}
	return writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return adminError(http.StatusInternalServerError, "encoding the answer: %v", err)
	}
	return nil
}

func adminError(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

// Interface guards
var (
	_ caddy.Module      = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)

package ratelimit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// overrideBody is the body of PUT /rate_limit/zones/<zone>/overrides:
// {"limit": n, "window": "<duration>", "burst": n, "expires": ...}, or
// {"action": "block"} or {"action": "exempt"}, each with an optional
// "expires": a duration from now ("90m", "2d") or an RFC 3339 time. The
// CLI writes it too (omitempty leaves out what a command does not set).
type overrideBody struct {
	Action  string `json:"action,omitempty"`
	Limit   *int64 `json:"limit,omitempty"`
	Window  string `json:"window,omitempty"`
	Burst   *int64 `json:"burst,omitempty"`
	Expires string `json:"expires,omitempty"`
}

// maxOverrideBody bounds the body PUT reads.
const maxOverrideBody = 4 << 10

// override reads the body as an Override at now.
func (b *overrideBody) override(now time.Time) (limiter.Override, error) {
	var o limiter.Override
	switch b.Action {
	case "", "limit":
		if b.Limit == nil {
			return o, errors.New(`give a "limit" (with an optional "window" and "burst"), or an "action": "block" or "exempt"`)
		}
		o.Action, o.Events = limiter.OverrideLimit, *b.Limit
		if b.Burst != nil {
			if *b.Burst <= 0 {
				return o, fmt.Errorf("burst must be positive, got %d", *b.Burst)
			}
			o.Burst = *b.Burst
		}
		if err := b.window(&o); err != nil {
			return o, err
		}
	default:
		a, err := limiter.ParseOverrideAction(b.Action)
		if err != nil {
			return o, err
		}
		if b.Limit != nil || b.Window != "" || b.Burst != nil {
			return o, fmt.Errorf("%s takes no limit, window or burst", b.Action)
		}
		o.Action = a
	}
	if b.Expires != "" {
		t, err := parseExpires(b.Expires, now)
		if err != nil {
			return o, err
		}
		o.Expires = t
	}
	return o, o.Check()
}

// window reads the body's window: a duration, or a calendar period.
func (b *overrideBody) window(o *limiter.Override) error {
	if b.Window == "" {
		return nil
	}
	if p := limiter.Period(b.Window); slices.Contains(limiter.Periods, p) {
		o.Period = p
		return nil
	}
	d, err := caddy.ParseDuration(b.Window)
	if err != nil || d <= 0 {
		return fmt.Errorf("window %q is neither a positive duration such as 1h nor day, week or month", b.Window)
	}
	o.Window = d
	return nil
}

// parseExpires reads an expiry: a positive duration from now, or an RFC
// 3339 time after now.
func parseExpires(s string, now time.Time) (time.Time, error) {
	if d, err := caddy.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("expires %q: a duration must be positive", s)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("expires %q is neither a duration such as 90m nor an RFC 3339 time such as 2026-12-01T00:00:00Z", s)
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("expires %q is already past", s)
	}
	return t, nil
}

// zoneOverrides is a zone's overrides as GET lists them.
type zoneOverrides struct {
	Zone      string         `json:"zone"`
	Overrides []overrideView `json:"overrides"`
}

// zoneOverride is one key's override as PUT and GET ?key= answer it.
type zoneOverride struct {
	Zone     string       `json:"zone"`
	Override overrideView `json:"override"`
}

// overrideRemoval is DELETE's answer: for a key, or a prefix.
type overrideRemoval struct {
	Zone    string `json:"zone"`
	Key     string `json:"key,omitempty"`
	Prefix  string `json:"prefix,omitempty"`
	Deleted bool   `json:"deleted"`
}

// overrideTarget is what an overrides route names: one key (?key=) or
// one prefix (?prefix=), as given; neither lists them all (GET).
type overrideTarget struct {
	text     string
	isPrefix bool
	given    bool
}

// overrideQuery reads the target of an overrides route: ?key= or
// ?prefix=, required but for a GET (which lists them all without).
func overrideQuery(r *http.Request) (overrideTarget, error) {
	q := r.URL.Query()
	hasKey, hasPrefix := q.Has("key"), q.Has("prefix")
	switch {
	case hasKey && hasPrefix:
		return overrideTarget{}, adminError(http.StatusBadRequest, "give ?key= or ?prefix=, not both")
	case hasPrefix:
		p := q.Get("prefix")
		if err := checkOverridePrefix(p); err != nil {
			return overrideTarget{}, adminError(http.StatusBadRequest, "%v", err)
		}
		return overrideTarget{text: p, isPrefix: true, given: true}, nil
	case hasKey && q.Get("key") != "":
		return overrideTarget{text: q.Get("key"), given: true}, nil
	case hasKey || r.Method != http.MethodGet:
		return overrideTarget{}, adminError(http.StatusBadRequest, "the key query parameter is required: ?key=<the key as the zone sees it, URL-encoded> (or ?prefix=<what the keys start with>, for every key that starts so)")
	}
	return overrideTarget{}, nil
}

// name is the target's name in the set of z (the first zone that reads
// it): a key as z's requests name it (keyTemplate.typed), or a prefix's
// limiter.PrefixOverrideName, the prefix escaped as z escapes its keys.
func (t overrideTarget) name(z *zone) string {
	if t.isPrefix {
		return limiter.PrefixOverrideName(z.key.typedPrefix(t.text))
	}
	return z.key.typed(t.text)
}

// check refuses a name no override of the target's kind may have.
func (t overrideTarget) check(name string) error {
	if p, isPrefix := limiter.OverridePrefix(name); t.isPrefix && isPrefix {
		return checkOverridePrefix(p)
	}
	return checkOverrideKey(name)
}

// what is the target as messages name it.
func (t overrideTarget) what() string {
	if t.isPrefix {
		return fmt.Sprintf("prefix %q", t.text)
	}
	return fmt.Sprintf("key %q", t.text)
}

// removal is DELETE's answer for the override kept under name.
func removal(zone, name string, deleted bool) overrideRemoval {
	if p, ok := limiter.OverridePrefix(name); ok {
		return overrideRemoval{Zone: zone, Prefix: p, Deleted: deleted}
	}
	return overrideRemoval{Zone: zone, Key: name, Deleted: deleted}
}

// serveOverrides answers /rate_limit/zones/<zone>/overrides. A name
// several handlers declare is answered for each distinct set of overrides
// (two memory zones of one name share theirs, as do two redis zones on one
// Redis and prefix); a change is checked against every zone of the name
// before any set is changed.
func serveOverrides(w http.ResponseWriter, r *http.Request, name string, found []registered) error {
	// Expiries are read and shown on the clock of the zones' handler
	// (the first's, for a name several handlers declare).
	now := found[0].zone.now()
	sets := distinctSets(found)
	target, err := overrideQuery(r)
	if err != nil {
		return err
	}
	switch r.Method {
	case http.MethodGet:
		return listOverrides(w, r, name, sets, target, now)
	case http.MethodPut:
		return putOverride(w, r, name, sets, target, now)
	case http.MethodDelete:
		var out []overrideRemoval
		for _, s := range sets {
			k := target.name(s.zone)
			had, err := s.set.remove(r.Context(), k)
			if err != nil {
				return adminError(http.StatusBadGateway, "zone %q: %v", name, err)
			}
			s.changed(k)
			out = append(out, removal(name, k, had))
		}
		return writeOneOrAll(w, out)
	}
	return adminError(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
}

// zoneSet is one distinct set of overrides of a zone name, with the zones
// that read it.
type zoneSet struct {
	set overrideSet
	// zone is the first zone that reads it, whose key template types the
	// keys the API is given.
	zone  *zone
	zones []*zone
}

// changed returns the leases every zone of the set holds for key.
func (s *zoneSet) changed(key string) {
	for _, z := range s.zones {
		z.overrideChanged(key, nil)
	}
}

func distinctSets(found []registered) []*zoneSet {
	var sets []*zoneSet
	for _, reg := range found {
		z := reg.zone
		if z.ov == nil || z.ov.set == nil {
			continue
		}
		i := slices.IndexFunc(sets, func(s *zoneSet) bool { return s.set == z.ov.set })
		if i < 0 {
			sets = append(sets, &zoneSet{set: z.ov.set, zone: z})
			i = len(sets) - 1
		}
		sets[i].zones = append(sets[i].zones, z)
	}
	return sets
}

func listOverrides(w http.ResponseWriter, r *http.Request, name string, sets []*zoneSet, target overrideTarget, now time.Time) error {
	if target.given {
		var out []zoneOverride
		for _, s := range sets {
			k := target.name(s.zone)
			all, err := s.set.list(r.Context(), now)
			if err != nil {
				return adminError(http.StatusBadGateway, "zone %q: %v", name, err)
			}
			if o, ok := all[k]; ok {
				out = append(out, zoneOverride{Zone: name, Override: viewOverride(k, o, now)})
			}
		}
		if len(out) == 0 {
			return adminError(http.StatusNotFound, "zone %q has no override for %s", name, target.what())
		}
		return writeOneOrAll(w, out)
	}
	var out []zoneOverrides
	for _, s := range sets {
		all, err := s.set.list(r.Context(), now)
		if err != nil {
			return adminError(http.StatusBadGateway, "zone %q: %v", name, err)
		}
		zo := zoneOverrides{Zone: name, Overrides: make([]overrideView, 0, len(all))}
		for k, o := range all {
			zo.Overrides = append(zo.Overrides, viewOverride(k, o, now))
		}
		// Keys' overrides first (a prefix's has no key), then prefixes',
		// each in order.
		slices.SortFunc(zo.Overrides, func(a, b overrideView) int {
			switch {
			case a.Prefix == "" && b.Prefix != "":
				return -1
			case a.Prefix != "" && b.Prefix == "":
				return 1
			}
			return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Prefix, b.Prefix))
		})
		out = append(out, zo)
	}
	return writeOneOrAll(w, out)
}

func putOverride(w http.ResponseWriter, r *http.Request, name string, sets []*zoneSet, target overrideTarget, now time.Time) error {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxOverrideBody+1))
	if err != nil {
		return adminError(http.StatusBadRequest, "reading the body: %v", err)
	}
	if len(raw) > maxOverrideBody {
		return adminError(http.StatusBadRequest, "the body is larger than %d bytes", maxOverrideBody)
	}
	var body overrideBody
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return adminError(http.StatusBadRequest, "the body must be a JSON object such as {\"limit\": 1000, \"window\": \"1h\"} or {\"action\": \"block\"}: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return adminError(http.StatusBadRequest, "the body must be one JSON object, with nothing after it")
	}
	o, err := body.override(now)
	if err != nil {
		return adminError(http.StatusBadRequest, "zone %q: %v", name, err)
	}
	for _, s := range sets {
		for _, z := range s.zones {
			if err := z.checkOverride(o); err != nil {
				return adminError(http.StatusBadRequest, "zone %q (%s): %v", name, z.limit.policy.Algorithm, err)
			}
			if o.Action == limiter.OverrideLimit {
				// Built now, so the bound on distinct limits refuses the
				// PUT past it rather than the key's requests ignoring it.
				if _, err := z.overrideLimit(o); err != nil {
					return adminError(http.StatusBadRequest, "zone %q: %v", name, err)
				}
			}
		}
		k := target.name(s.zone)
		if err := target.check(k); err != nil {
			return adminError(http.StatusBadRequest, "zone %q: %v", name, err)
		}
		t := s.set.table()
		_, had := t.Get(k)
		switch {
		case had:
		case t.Len() >= maxOverrides:
			return adminError(http.StatusBadRequest, "zone %q already holds %d overrides, the most one zone may", name, maxOverrides)
		case target.isPrefix && t.Prefixes() >= limiter.MaxPrefixOverrides:
			return adminError(http.StatusBadRequest, "zone %q already holds %d prefix overrides, the most one zone may: delete one, or give the keys a shorter prefix they share", name, limiter.MaxPrefixOverrides)
		}
	}
	var out []zoneOverride
	for _, s := range sets {
		k := target.name(s.zone)
		written, err := s.set.put(r.Context(), k, o, keepGen(s.zones, o, now))
		if err != nil {
			status := http.StatusBadGateway
			switch {
			case errors.Is(err, limiter.ErrInvalidOverride) || errors.Is(err, limiter.ErrTooManyOverrides) || errors.Is(err, limiter.ErrTooManyPrefixOverrides):
				status = http.StatusBadRequest
			case errors.Is(err, redisstore.ErrOverrideConflict):
				status = http.StatusConflict
			}
			return adminError(status, "zone %q: %v", name, err)
		}
		s.changed(k)
		out = append(out, zoneOverride{Zone: name, Override: viewOverride(k, written, now)})
	}
	return writeOneOrAll(w, out)
}

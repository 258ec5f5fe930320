package limiter

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// OverrideAction is what an override does to its key's requests.
type OverrideAction uint8

// The override actions. The zero value is not one: a record without an
// action is refused when parsed.
const (
	// OverrideLimit decides the key by a quota of its own instead of its
	// zone's or tier's (a customer's upgrade).
	OverrideLimit OverrideAction = iota + 1
	// OverrideBlock refuses every request of the key (a suspected abuser).
	OverrideBlock
	// OverrideExempt never limits the key (an internal client).
	OverrideExempt
)

// String is the action as the admin API and the stored records name it.
func (a OverrideAction) String() string {
	switch a {
	case OverrideLimit:
		return "limit"
	case OverrideBlock:
		return "block"
	case OverrideExempt:
		return "exempt"
	}
	return fmt.Sprintf("OverrideAction(%d)", uint8(a))
}

// ParseOverrideAction reads an action's name.
func ParseOverrideAction(s string) (OverrideAction, error) {
	switch s {
	case "limit":
		return OverrideLimit, nil
	case "block":
		return OverrideBlock, nil
	case "exempt":
		return OverrideExempt, nil
	}
	return 0, fmt.Errorf("unknown action %q (want limit, block or exempt)", s)
}

// MaxOverrideKeyLen bounds an override's key, in bytes: longer than any key
// a zone's template makes from a request's bounded fields, short enough
// that a table of many overrides stays small.
const MaxOverrideKeyLen = 1024

// CheckOverrideKey refuses a key no override may have: "" (no zone's
// template makes an empty key, and the Redis store names a set's version
// by it) or one longer than MaxOverrideKeyLen. Both stores of overrides
// and the admin API judge keys by it, so they refuse the same ones.
func CheckOverrideKey(key string) error {
	switch {
	case key == "":
		return errors.New("an override needs a key")
	case len(key) > MaxOverrideKeyLen:
		return fmt.Errorf("key of %d bytes is longer than the %d an override's may be", len(key), MaxOverrideKeyLen)
	}
	return nil
}

// Override is one key's exception to its zone's limit, set at run time by
// an operator and kept in the zone's store (per instance for a memory
// zone, shared through Redis for a redis zone). Its zero quota fields take
// the zone's: an override is resolved against the zone it applies to when
// it is applied, so it follows a reload that changes the zone's window.
type Override struct {
	Action OverrideAction
	// Events is the quota of an OverrideLimit.
	Events int64
	// Window is its window; zero takes the zone's.
	Window time.Duration
	// Period is its calendar period, for a calendar zone; "" takes the
	// zone's.
	Period Period
	// Burst is its bucket capacity; zero takes the zone's.
	Burst int64
	// Expires is when the override lapses, to the millisecond; the zero
	// time never.
	Expires time.Time
	// Gen names the state of an OverrideLimit's key under its limit (see
	// StateKey). The writer gives a new limit a new Gen, and keeps the
	// old one when only the expiry changes, so every instance tells the
	// key's successive limits apart alike. Zero is a record written
	// without one.
	Gen int64
}

// MaxOverrideGen bounds Gen so it stays exact as a JSON number in every
// reader (a double's 53 bits).
const MaxOverrideGen = 1<<53 - 1

// NewOverrideGen draws the Gen of a limit set anew: random, so writers on
// different instances need not agree on a counter, and never 0.
func NewOverrideGen() int64 { return 1 + rand.Int64N(MaxOverrideGen) }

// KeepGen tells a writer whether old, the key's override in force as the
// write finds it, has the limit of the override being written, so the
// key's state carries on under it (only the expiry changes).
type KeepGen func(old Override) bool

// WithGen is o with the Gen its write gives it, when the key held old
// (had): old's when keep says the limit is the same, a new one otherwise.
// A block or an exemption keeps no state and has none; a nil keep leaves
// o's as given.
func (o Override) WithGen(old Override, had bool, keep KeepGen) Override {
	switch {
	case keep == nil:
	case o.Action != OverrideLimit:
		o.Gen = 0
	case had && keep(old):
		o.Gen = old.Gen
	default:
		o.Gen = NewOverrideGen()
	}
	return o
}

// StateKey is the name under which key's state is kept while o decides
// it: the key and Gen, so a limit set anew starts afresh without erasing
// any state. A request still running under the key's earlier limit gives
// its units back to the state it took them from, not into the fresh one;
// erased and refilled instead, the fresh state would get them back and
// admit past its limit. The last NUL divides the two, and Gen has no NUL,
// so no two pairs with a Gen share a name. Gen 0 (a record written
// before generations) names the bare key, as its writer did, so an
// upgrade keeps the state of the keys under such records; a key that
// holds a NUL could share that name only with a generation it cannot
// know (NewOverrideGen is random).
func (o *Override) StateKey(key string) string {
	if o.Gen == 0 {
		return key
	}
	var gen [16]byte // on the stack: the name is the one allocation
	return key + "\x00" + string(strconv.AppendInt(gen[:0], o.Gen, 36))
}

// Active reports whether o is in force at now: it lapses at Expires.
func (o *Override) Active(now time.Time) bool {
	return o.Expires.IsZero() || now.Before(o.Expires)
}

// overrideRecord is an Override as stored and sent: JSON with integer
// units, so every instance reads it alike whatever its Go version.
type overrideRecord struct {
	Action    string `json:"action"`
	Limit     int64  `json:"limit,omitempty"`
	WindowUS  int64  `json:"window_us,omitempty"`
	Period    string `json:"period,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	ExpiresMS int64  `json:"expires_ms,omitempty"`
	Gen       int64  `json:"gen,omitempty"`
}

// MarshalJSON implements json.Marshaler with the stored record's format.
func (o Override) MarshalJSON() ([]byte, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	r := overrideRecord{Action: o.Action.String(), Limit: o.Events, WindowUS: o.Window.Microseconds(), Period: string(o.Period), Burst: o.Burst, Gen: o.Gen}
	if !o.Expires.IsZero() {
		r.ExpiresMS = o.Expires.UnixMilli()
	}
	return json.Marshal(r)
}

// UnmarshalJSON implements json.Unmarshaler, refusing a record Check
// refuses: a corrupt or foreign value is never applied.
func (o *Override) UnmarshalJSON(b []byte) error {
	var r overrideRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("override record: %w", err)
	}
	a, err := ParseOverrideAction(r.Action)
	if err != nil {
		return fmt.Errorf("override record: %w", err)
	}
	v := Override{Action: a, Events: r.Limit, Window: time.Duration(r.WindowUS) * time.Microsecond, Period: Period(r.Period), Burst: r.Burst, Gen: r.Gen}
	if r.WindowUS < 0 || r.WindowUS > int64(maxOverrideWindow/time.Microsecond) {
		return fmt.Errorf("override record: window_us %d out of range", r.WindowUS)
	}
	if r.ExpiresMS != 0 {
		v.Expires = time.UnixMilli(r.ExpiresMS)
	}
	if err := v.Check(); err != nil {
		return fmt.Errorf("override record: %w", err)
	}
	*o = v
	return nil
}

// maxOverrideWindow bounds an override's window as a zone's is bounded.
const maxOverrideWindow = 366 * 24 * time.Hour

// Check refuses an override that is not one: an unknown action, a quota
// on an action that takes none, or numbers out of range. Whether its
// quota suits the zone's algorithm is the zone's to check (Policy).
func (o *Override) Check() error {
	switch o.Action {
	case OverrideLimit:
		if o.Events <= 0 {
			return fmt.Errorf("limit must be positive, got %d", o.Events)
		}
		if o.Window < 0 || o.Window > maxOverrideWindow {
			return fmt.Errorf("window must be from 1µs to %v, got %v", maxOverrideWindow, o.Window)
		}
		if o.Burst < 0 {
			return fmt.Errorf("burst must not be negative, got %d", o.Burst)
		}
		if o.Period != "" {
			if !slices.Contains(Periods, o.Period) {
				return fmt.Errorf("unknown period %q (want day, week or month)", o.Period)
			}
			if o.Window != 0 {
				return errors.New("give a window or a period, not both")
			}
		}
	case OverrideBlock, OverrideExempt:
		if o.Events != 0 || o.Window != 0 || o.Burst != 0 || o.Period != "" {
			return fmt.Errorf("%s takes no limit, window, period or burst", o.Action)
		}
	default:
		return fmt.Errorf("unknown action %d", o.Action)
	}
	if o.Gen < 0 || o.Gen > MaxOverrideGen {
		return fmt.Errorf("gen must be from 0 to %d, got %d", int64(MaxOverrideGen), o.Gen)
	}
	if !o.Expires.IsZero() && o.Expires.UnixMilli() <= 0 {
		return fmt.Errorf("expires %v is before 1970", o.Expires)
	}
	return nil
}

// Policy is p (the policy of the zone the override applies to) with the
// override's quota: the algorithm and max_delay stay; a window, period or
// burst the override leaves out stays the zone's.
func (o *Override) Policy(p Policy) Policy {
	p.Events = o.Events
	if o.Burst != 0 {
		p.Burst = o.Burst
	}
	switch {
	case p.Calendar != nil && o.Period != "":
		p.Calendar = &Calendar{Period: o.Period, Location: p.Calendar.Location}
	case p.Calendar == nil && o.Window != 0:
		p.Window = o.Window
	}
	return p
}

// OverrideTable is one zone's overrides by name (a key's, or a prefix's:
// PrefixOverrideName), read on every request of the zone and written
// rarely. A zone without any pays two atomic loads; one with prefix
// overrides but no key's own pays one load and a walk of its trie that
// ends where the key leaves every prefix.
type OverrideTable struct {
	// n counts the overrides, exact the keys' own among them: a lookup of
	// a key takes the lock only when some key has one.
	n, exact atomic.Int64
	// prefixes is the trie of the prefix overrides, nil when there are
	// none; replaced whole under mu (see prefixNode).
	prefixes atomic.Pointer[prefixNode]
	mu       sync.RWMutex
	m        map[string]Override
}

// NewOverrideTable returns an empty table.
func NewOverrideTable() *OverrideTable {
	return &OverrideTable{m: map[string]Override{}}
}

// Lookup returns key's own override, expired or not: the caller, which
// knows the time, asks Active. A prefix's override is LongestPrefix's.
func (t *OverrideTable) Lookup(key string) (Override, bool) {
	if t == nil || t.exact.Load() == 0 {
		return Override{}, false
	}
	t.mu.RLock()
	o, ok := t.m[key]
	t.mu.RUnlock()
	return o, ok
}

// Get returns the override kept under name (a key, or a prefix's
// PrefixOverrideName), expired or not.
func (t *OverrideTable) Get(name string) (Override, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	o, ok := t.m[name]
	return o, ok
}

// LongestPrefix returns the override of the longest prefix of key, at
// most most bytes long, that has one, expired or not: most is len(key)
// for any, or one less than a lapsed prefix's length for the next one
// down. It takes no lock and allocates nothing.
func (t *OverrideTable) LongestPrefix(key string, most int) (prefix string, o Override, ok bool) {
	if t == nil {
		return "", Override{}, false
	}
	root := t.prefixes.Load()
	if root == nil {
		return "", Override{}, false
	}
	n := root.longest(key, most)
	if n == nil {
		return "", Override{}, false
	}
	return n.prefix, n.o, true
}

// Put sets name's override, reporting whether that changed it.
func (t *OverrideTable) Put(name string, o Override) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.m[name]
	t.setLocked(name, o, had)
	return !had || old != o
}

// PutWithin is Put for the table that is a zone's only store (a memory
// zone's), holding at most most overrides, MaxPrefixOverrides of them
// prefixes': a new name is refused with ErrTooManyOverrides (or, a
// prefix's, ErrTooManyPrefixOverrides) once it holds that many, and o's
// Gen is decided by keep from the name's override as it stands (see
// KeepGen; nil: o's as given), all under one lock, so writers at once
// can neither pass the bounds nor each start the key afresh. It returns
// the override put.
func (t *OverrideTable) PutWithin(name string, o Override, most int, keep KeepGen) (Override, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.m[name]
	if !had && len(t.m) >= most {
		return Override{}, fmt.Errorf("%w: the zone holds %d already", ErrTooManyOverrides, len(t.m))
	}
	if _, isPrefix := OverridePrefix(name); isPrefix && !had {
		if n := len(t.m) - int(t.exact.Load()); n >= MaxPrefixOverrides {
			return Override{}, fmt.Errorf("%w: the zone holds %d already", ErrTooManyPrefixOverrides, n)
		}
	}
	o = o.WithGen(old, had, keep)
	t.setLocked(name, o, had)
	return o, nil
}

// setLocked puts o under name, which the table held already when had.
// The name of an empty prefix, which no writer puts (CheckOverrideName),
// is kept as a key's would be, and so matches no request's key.
func (t *OverrideTable) setLocked(name string, o Override, had bool) {
	t.m[name] = o
	if p, isPrefix := OverridePrefix(name); isPrefix && p != "" {
		root := t.prefixes.Load()
		if root == nil {
			root = &prefixNode{}
		}
		t.prefixes.Store(root.with(p, p, o))
	} else if !had {
		t.exact.Add(1)
	}
	t.n.Store(int64(len(t.m)))
}

// Remove deletes name's override, reporting whether there was one.
func (t *OverrideTable) Remove(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, had := t.m[name]; !had {
		return false
	}
	t.removeLocked(name)
	return true
}

// removeLocked deletes name's override, which the table holds.
func (t *OverrideTable) removeLocked(name string) {
	delete(t.m, name)
	if p, isPrefix := OverridePrefix(name); isPrefix && p != "" {
		if root := t.prefixes.Load(); root != nil {
			root, _ = root.without(p, true)
			if len(root.kids) == 0 {
				root = nil
			}
			t.prefixes.Store(root)
		}
	} else {
		t.exact.Add(-1)
	}
	t.n.Store(int64(len(t.m)))
}

// Replace makes the table hold exactly all, and returns the names whose
// override it changed (set, changed or removed), so their leases can be
// given back. The table keeps all.
func (t *OverrideTable) Replace(all map[string]Override) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var changed []string
	for k, old := range t.m {
		if o, ok := all[k]; !ok || o != old {
			changed = append(changed, k)
		}
	}
	for k := range all {
		if _, had := t.m[k]; !had {
			changed = append(changed, k)
		}
	}
	t.m = all
	t.rebuildLocked()
	return changed
}

// rebuildLocked makes the counts and the trie those of t.m.
func (t *OverrideTable) rebuildLocked() {
	var prefixes []prefixEntry
	for name, o := range t.m {
		if p, isPrefix := OverridePrefix(name); isPrefix && p != "" {
			prefixes = append(prefixes, prefixEntry{p, o})
		}
	}
	t.prefixes.Store(buildPrefixes(prefixes))
	t.exact.Store(int64(len(t.m) - len(prefixes)))
	t.n.Store(int64(len(t.m)))
}

// RemoveExpired deletes every override that lapsed by now and returns
// their names.
func (t *OverrideTable) RemoveExpired(now time.Time) []string {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var gone []string
	prefixes := false
	for k, o := range t.m {
		if !o.Active(now) {
			gone = append(gone, k)
			delete(t.m, k)
			if p, isPrefix := OverridePrefix(k); isPrefix && p != "" {
				prefixes = true
			}
		}
	}
	if prefixes {
		t.rebuildLocked()
	} else {
		t.exact.Add(-int64(len(gone)))
		t.n.Store(int64(len(t.m)))
	}
	return gone
}

// Snapshot copies the table.
func (t *OverrideTable) Snapshot() map[string]Override {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make(map[string]Override, len(t.m))
	for k, o := range t.m {
		out[k] = o
	}
	return out
}

// Len is how many overrides the table holds, keys' and prefixes', lapsed
// ones included until they are removed.
func (t *OverrideTable) Len() int {
	if t == nil {
		return 0
	}
	return int(t.n.Load())
}

// Prefixes is how many of them are prefixes'.
func (t *OverrideTable) Prefixes() int {
	if t == nil {
		return 0
	}
	return int(t.n.Load() - t.exact.Load())
}

// MaxOverrides bounds how many overrides one zone holds.
const MaxOverrides = 1_000_000

// ErrInvalidOverride is wrapped by the errors of Set and Delete that refuse
// their arguments (a key that is empty or too long, an override Check
// refuses, an expiry already past), so a caller can tell them from
// failures of Redis.
var ErrInvalidOverride = errors.New("invalid override")

// ErrTooManyOverrides is wrapped by Set's error when the zone holds
// MaxOverrides already and the key is a new one.
var ErrTooManyOverrides = errors.New("too many overrides")

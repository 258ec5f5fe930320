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

// OverrideTable is one zone's overrides by key, read on every request of
// the zone and written rarely. A zone without any pays one atomic load.
type OverrideTable struct {
	n  atomic.Int64
	mu sync.RWMutex
	m  map[string]Override
}

// NewOverrideTable returns an empty table.
func NewOverrideTable() *OverrideTable {
	return &OverrideTable{m: map[string]Override{}}
}

// Lookup returns key's override, expired or not: the caller, which knows
// the time, asks Active.
func (t *OverrideTable) Lookup(key string) (Override, bool) {
	if t == nil || t.n.Load() == 0 {
		return Override{}, false
	}
	t.mu.RLock()
	o, ok := t.m[key]
	t.mu.RUnlock()
	return o, ok
}

// Put sets key's override, reporting whether that changed it.
func (t *OverrideTable) Put(key string, o Override) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.m[key]
	t.m[key] = o
	t.n.Store(int64(len(t.m)))
	return !had || old != o
}

// PutWithin is Put for the table that is a zone's only store (a memory
// zone's), holding at most most overrides: a new key is refused with
// ErrTooManyOverrides once it holds that many, and o's Gen is decided by
// keep from the key's override as it stands (see KeepGen; nil: o's as
// given), all under one lock, so writers at once can neither pass the
// bound nor each start the key afresh. It returns the override put.
func (t *OverrideTable) PutWithin(key string, o Override, most int, keep KeepGen) (Override, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.m[key]
	if !had && len(t.m) >= most {
		return Override{}, fmt.Errorf("%w: the zone holds %d already", ErrTooManyOverrides, len(t.m))
	}
	o = o.WithGen(old, had, keep)
	t.m[key] = o
	t.n.Store(int64(len(t.m)))
	return o, nil
}

// Remove deletes key's override, reporting whether there was one.
func (t *OverrideTable) Remove(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, had := t.m[key]
	delete(t.m, key)
	t.n.Store(int64(len(t.m)))
	return had
}

// Replace makes the table hold exactly all, and returns the keys whose
// override it changed (set, changed or removed), so their leases can be
// given back.
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
	t.n.Store(int64(len(all)))
	return changed
}

// RemoveExpired deletes every override that lapsed by now and returns
// their keys.
func (t *OverrideTable) RemoveExpired(now time.Time) []string {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var gone []string
	for k, o := range t.m {
		if !o.Active(now) {
			delete(t.m, k)
			gone = append(gone, k)
		}
	}
	t.n.Store(int64(len(t.m)))
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

// Len is how many overrides the table holds, lapsed ones included until
// they are removed.
func (t *OverrideTable) Len() int {
	if t == nil {
		return 0
	}
	return int(t.n.Load())
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

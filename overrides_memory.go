package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// maxOverrides bounds how many overrides one zone holds, so a table stays
// within memory an operator can plan for (see docs/admin-api.md, "Runtime overrides").
const maxOverrides = limiter.MaxOverrides

// memoryOverrides is one memory zone name's overrides: this instance's
// alone, saved in Caddy's storage (by default the data directory) after
// every change.
type memoryOverrides struct {
	name    string
	t       *limiter.OverrideTable
	storage certmagic.Storage
	// changes counts the changes made; saved, under saveMu, is the count
	// the stored copy holds, so concurrent changes share one write.
	changes atomic.Uint64
	saveMu  sync.Mutex
	saved   uint64
}

// overridesStorageKey is where a memory zone's overrides are saved.
func overridesStorageKey(zone string) string {
	return "rate_limit/overrides/" + url.PathEscape(zone) + ".json"
}

// storedOverrides is the saved form of a zone's overrides.
type storedOverrides struct {
	Zone      string                     `json:"zone"`
	Overrides map[string]json.RawMessage `json:"overrides"`
}

// loadMemoryOverrides returns zone's overrides, read from ctx's storage the
// first time the process provisions that name (those lapsed by now, on
// the provisioning handler's clock, left out). A stored copy that cannot
// be read is logged and left as it is until the next change replaces it;
// an override in it that cannot be read is logged and skipped.
func loadMemoryOverrides(ctx caddy.Context, zone string, keys *limiter.KeyHasher, now time.Time, logger *zap.Logger) *memoryOverrides {
	sets := &memoryOverrideSets
	sets.mu.Lock()
	defer sets.mu.Unlock()
	if m := sets.byName[zone]; m != nil {
		return m
	}
	m := &memoryOverrides{name: zone, t: limiter.NewOverrideTable(), storage: configStorage(ctx)}
	sets.byName[zone] = m
	if m.storage == nil {
		return m
	}
	key := overridesStorageKey(zone)
	raw, err := m.storage.Load(ctx, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m
	case err != nil:
		logger.Error("a memory zone's saved overrides could not be read; the zone starts without them", zap.String("zone", zone), zap.String("storage_key", key), zap.Error(err))
		return m
	}
	var stored storedOverrides
	if err := json.Unmarshal(raw, &stored); err != nil {
		logger.Error("a memory zone's saved overrides are corrupt; the zone starts without them", zap.String("zone", zone), zap.String("storage_key", key), zap.Error(err))
		return m
	}
	all := make(map[string]limiter.Override, len(stored.Overrides))
	for k, v := range stored.Overrides {
		var o limiter.Override
		if err := json.Unmarshal(v, &o); err != nil || limiter.CheckOverrideName(k) != nil {
			logger.Warn("a saved override cannot be read; skipped", zap.String("zone", zone), zap.String("key_hash", keys.Hex(k)), zap.Error(err))
			continue
		}
		if o.Active(now) {
			all[k] = o
		}
	}
	m.t.Replace(all)
	return m
}

// checkOverrideKey refuses a key no override may have, as the admin API
// names it: one that starts like a prefix override's name is refused too
// (a zone's requests never have one: see limiter.PrefixOverrideName).
func checkOverrideKey(key string) error {
	if err := limiter.CheckOverrideKey(key); err != nil {
		return err
	}
	if _, isPrefix := limiter.OverridePrefix(key); isPrefix {
		return errors.New(`a key may not start with NUL "prefix" NUL, which names prefix overrides: give the prefix as ?prefix=`)
	}
	return nil
}

// checkOverridePrefix refuses a prefix no override may have, as the
// admin API names it.
func checkOverridePrefix(p string) error {
	switch {
	case p == "":
		return errors.New("an empty prefix would match every key, which is the zone's own limit: change the zone's rate in the config instead, or give a prefix of at least one byte")
	case len(p) > limiter.MaxOverrideKeyLen:
		return fmt.Errorf("prefix of %d bytes is longer than the %d an override's may be", len(p), limiter.MaxOverrideKeyLen)
	}
	return nil
}

func (m *memoryOverrides) table() *limiter.OverrideTable { return m.t }

func (m *memoryOverrides) put(ctx context.Context, name string, o limiter.Override, keep limiter.KeepGen) (limiter.Override, error) {
	if err := limiter.CheckOverrideName(name); err != nil {
		return limiter.Override{}, err
	}
	o, err := m.t.PutWithin(name, o, maxOverrides, keep)
	if err != nil {
		most := maxOverrides
		if errors.Is(err, limiter.ErrTooManyPrefixOverrides) {
			most = limiter.MaxPrefixOverrides
		}
		return limiter.Override{}, fmt.Errorf("zone %q: %w (the most one zone may is %d)", m.name, err, most)
	}
	return o, m.save(ctx, m.changes.Add(1))
}

func (m *memoryOverrides) remove(ctx context.Context, name string) (bool, error) {
	if !m.t.Remove(name) {
		return false, nil
	}
	return true, m.save(ctx, m.changes.Add(1))
}

func (m *memoryOverrides) list(_ context.Context, now time.Time) (map[string]limiter.Override, error) {
	all := m.t.Snapshot()
	for k, o := range all {
		if !o.Active(now) {
			delete(all, k)
		}
	}
	return all, nil
}

// save writes the table to storage unless a write that began after change
// number change already did. An override that lapsed and is not yet
// swept is written too: the set has no clock of its own (each handler
// that reads it judges time on its own), and a load leaves out what has
// lapsed by then.
func (m *memoryOverrides) save(ctx context.Context, change uint64) error {
	if m.storage == nil {
		return nil
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	if m.saved >= change {
		return nil
	}
	upTo := m.changes.Load()
	all := m.t.Snapshot()
	stored := storedOverrides{Zone: m.name, Overrides: make(map[string]json.RawMessage, len(all))}
	for k, o := range all {
		b, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("saving overrides: %w", err)
		}
		stored.Overrides[k] = b
	}
	raw, err := json.Marshal(stored)
	if err != nil {
		return fmt.Errorf("saving overrides: %w", err)
	}
	if err := m.storage.Store(ctx, overridesStorageKey(m.name), raw); err != nil {
		return fmt.Errorf("the override is in force on this instance but could not be saved in Caddy's storage, so a restart would lose it: %w", err)
	}
	m.saved = upTo
	return nil
}

// configStorage is the storage of ctx's config, or nil for a context
// without a config (one a test makes by hand), whose Storage panics.
func configStorage(ctx caddy.Context) (s certmagic.Storage) {
	defer func() {
		if recover() != nil {
			s = nil
		}
	}()
	return ctx.Storage()
}

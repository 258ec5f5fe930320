package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// prefixHolds is nil once table's longest prefix of key is want's, with
// override o (want "": none).
func prefixHolds(table *limiter.OverrideTable, key, want string, o limiter.Override) func() error {
	return func() error {
		p, got, ok := table.LongestPrefix(key, len(key))
		switch {
		case want == "" && ok:
			return fmt.Errorf("%q still matches prefix %q", key, p)
		case want != "" && (!ok || p != want || got != o):
			return fmt.Errorf("%q matches %q %+v (%v), want %q %+v", key, p, got, ok, want, o)
		}
		return nil
	}
}

// TestRedisPrefixOverridesPropagate: a prefix override set, changed and
// deleted on one instance is in another's trie within a second, applied
// by reading its field alone, the other told through OnChange by the
// prefix's name; a key's own override beside it stays a key's.
func TestRedisPrefixOverridesPropagate(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	b := newTestOverrides(t, s.Client(t), OverridesOptions{})
	a.zone(t, "api")
	table := b.zone(t, "api")
	b.subscribed(t, "api")
	loads := b.loads("api")
	acme := limiter.PrefixOverrideName("acme:")
	a.set(t, "api", acme, tenX)
	testutil.Within(t, "b to apply the prefix", propagationLimit, prefixHolds(table, "acme:42", "acme:", tenX))
	a.set(t, "api", "acme:7", block)
	testutil.Within(t, "b to apply the key's own", propagationLimit, holds(table, "acme:7", &block))
	a.set(t, "api", acme, twoX)
	testutil.Within(t, "b to apply the change", propagationLimit, prefixHolds(table, "acme:42", "acme:", twoX))
	if _, err := a.Delete(ctx, "api", acme); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, "b to apply the delete", propagationLimit, prefixHolds(table, "acme:42", "", limiter.Override{}))
	if err := holds(table, "acme:7", &block)(); err != nil {
		t.Errorf("the key's own override after its prefix's delete: %v", err)
	}
	if got := b.loads("api"); got != loads {
		t.Errorf("b reloaded the set %d times, want each change applied by its field", got-loads)
	}
	if got := b.events.changes(); slices.Index(got, "api/"+acme) < 0 {
		t.Errorf("OnChange told %q, want the prefix's name among them", got)
	}
	if list, err := a.List(ctx, "api"); err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v; want the key's own alone (the count field is no override)", list, err)
	}
	if skips := append(a.events.skips(), b.events.skips()...); len(skips) > 0 {
		t.Errorf("records skipped: %q", skips)
	}
}

// TestRedisPrefixOverridesBound: the script counts a set's prefixes as
// they are written, deleted and pruned, and refuses a new one past the
// bound (ErrTooManyPrefixOverrides) while a held one may change and keys'
// overrides are not counted; a load skips the prefixes past the bound a
// set holds by other means.
func TestRedisPrefixOverridesBound(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	clock := testutil.NewClock(time.Now().Truncate(time.Millisecond))
	a := newTestOverrides(t, s.Client(t), OverridesOptions{Clock: clock})
	a.mostPrefixes = 3
	name := func(i int) string { return limiter.PrefixOverrideName(fmt.Sprintf("t%d:", i)) }
	lapsing := block
	lapsing.Expires = clock.Now().Add(time.Minute)
	a.set(t, "api", name(0), lapsing)
	a.set(t, "api", name(1), block)
	a.set(t, "api", name(2), block)
	a.set(t, "api", "a-key", block)
	if err := a.Set(ctx, "api", name(3), block); !errors.Is(err, limiter.ErrTooManyPrefixOverrides) {
		t.Fatalf("a fourth prefix of three: %v, want ErrTooManyPrefixOverrides", err)
	}
	a.set(t, "api", name(1), exempt)
	a.set(t, "api", "another-key", block)
	if _, err := a.Delete(ctx, "api", name(2)); err != nil {
		t.Fatal(err)
	}
	a.set(t, "api", name(3), block)
	if err := a.Set(ctx, "api", name(4), block); !errors.Is(err, limiter.ErrTooManyPrefixOverrides) {
		t.Fatalf("a fourth prefix after a delete and a set: %v, want ErrTooManyPrefixOverrides", err)
	}
	clock.Advance(2 * time.Minute)
	if _, err := a.List(ctx, "api"); err != nil { // prunes the lapsed t0:
		t.Fatal(err)
	}
	a.set(t, "api", name(4), block)
	count, err := s.Client(t).HGet(ctx, a.setKey("api"), limiter.PrefixCountField).Result()
	if err != nil || count != "3" {
		t.Errorf("the set counts %q prefixes (%v), want 3", count, err)
	}

	// Past the bound by hand: a load takes three, and says so.
	if err := s.Client(t).HSet(ctx, a.setKey("api"), name(9), `{"action":"block"}`).Err(); err != nil {
		t.Fatal(err)
	}
	b := newTestOverrides(t, s.Client(t), OverridesOptions{Clock: clock})
	b.mostPrefixes = 3
	if table := b.zone(t, "api"); table.Prefixes() != 3 || table.Len() != 5 {
		t.Errorf("b loaded %d prefixes of %d overrides, want 3 of 5", table.Prefixes(), table.Len())
	}
	if errs := b.events.errors(); len(errs) != 1 {
		t.Errorf("b told %v, want one error about the prefixes past the bound", errs)
	}
}

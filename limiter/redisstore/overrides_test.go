package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// propagationLimit is how soon a change must reach another instance.
const propagationLimit = time.Second

// overrideEvents records what a Overrides tells its caller.
type overrideEvents struct {
	mu      sync.Mutex
	changed []string // "zone/key"
	skipped []string // "zone/key: error"
	errs    []error
}

func (e *overrideEvents) options(opts OverridesOptions) OverridesOptions {
	opts.OnChange = func(zone, key string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.changed = append(e.changed, zone+"/"+key)
	}
	opts.OnSkip = func(zone, key string, err error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.skipped = append(e.skipped, fmt.Sprintf("%s/%s: %v", zone, key, err))
	}
	opts.OnError = func(err error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.errs = append(e.errs, err)
	}
	return opts
}

func (e *overrideEvents) changes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.changed)
}

func (e *overrideEvents) skips() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.skipped)
}

func (e *overrideEvents) errors() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.errs)
}

// testOverrides is one instance's Overrides and what it told.
type testOverrides struct {
	*Overrides
	events *overrideEvents
}

// newTestOverrides opens a Overrides on client, closed by t.Cleanup.
func newTestOverrides(t testing.TB, client redis.UniversalClient, opts OverridesOptions) testOverrides {
	t.Helper()
	ev := &overrideEvents{}
	r, err := NewOverrides(client, ev.options(opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return testOverrides{r, ev}
}

// zone opens zone and fails t on error.
func (o testOverrides) zone(t testing.TB, zone string) *limiter.OverrideTable {
	t.Helper()
	table, err := o.Zone(context.Background(), zone)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// set sets key's override and fails t on error.
func (o testOverrides) set(t testing.TB, zone, key string, ov limiter.Override) {
	t.Helper()
	if err := o.Set(context.Background(), zone, key, ov); err != nil {
		t.Fatal(err)
	}
}

// loads is how many times zone's set was loaded whole.
func (o testOverrides) loads(zone string) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.zones[zone].loads.Load()
}

// subscribed waits until zone's subscription is confirmed and handled, so
// that no message published after it is missed.
func (o testOverrides) subscribed(t testing.TB, zone string) {
	t.Helper()
	o.mu.Lock()
	z := o.zones[zone]
	o.mu.Unlock()
	testutil.Eventually(t, zone+"'s subscription", func() error {
		if z.subscriptions.Load() == 0 {
			return errors.New("not subscribed yet")
		}
		return nil
	})
}

// holds is nil once table holds want for key (nil: no override).
func holds(table *limiter.OverrideTable, key string, want *limiter.Override) func() error {
	return func() error {
		got, ok := table.Lookup(key)
		switch {
		case want == nil && ok:
			return fmt.Errorf("%q still has %+v", key, got)
		case want != nil && !ok:
			return fmt.Errorf("%q has no override yet", key)
		case want != nil && got != *want:
			return fmt.Errorf("%q has %+v, want %+v", key, got, *want)
		}
		return nil
	}
}

// redisClient is a client of addrs as Config.NewClient makes it,
// closed by t.Cleanup.
func redisClient(t testing.TB, cfg Config) redis.UniversalClient {
	t.Helper()
	c, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var (
	tenX   = limiter.Override{Action: limiter.OverrideLimit, Events: 1000, Window: time.Minute}
	twoX   = limiter.Override{Action: limiter.OverrideLimit, Events: 200, Window: time.Minute, Burst: 20, Gen: limiter.MaxOverrideGen}
	block  = limiter.Override{Action: limiter.OverrideBlock}
	exempt = limiter.Override{Action: limiter.OverrideExempt}
)

// TestRedisOverridesPropagate: an override set, changed and deleted on one
// instance is in another's table within a second, each change applied by
// reading its key alone (no reload), the other told through OnChange and
// the writer not; the writer's table has it when Set returns.
func TestRedisOverridesPropagate(t *testing.T) {
	s := redistest.Start(t)
	cfg := Config{Addresses: []string{s.Addr()}}
	a := newTestOverrides(t, redisClient(t, cfg), OverridesOptions{})
	b := newTestOverrides(t, redisClient(t, cfg), OverridesOptions{})
	ta, tb := a.zone(t, "api"), b.zone(t, "api")
	ctx := context.Background()
	a.subscribed(t, "api")
	b.subscribed(t, "api")

	for i, o := range []limiter.Override{tenX, twoX, block, exempt} {
		a.set(t, "api", "alice", o)
		if err := holds(ta, "alice", &o)(); err != nil {
			t.Fatalf("the writer's own table: %v", err)
		}
		d := testutil.Within(t, "b to apply "+o.Action.String(), propagationLimit, holds(tb, "alice", &o))
		t.Logf("change %d applied by the other instance in %v", i, d)
	}
	existed, err := a.Delete(ctx, "api", "alice")
	if err != nil || !existed {
		t.Fatalf("Delete = %v, %v; want true", existed, err)
	}
	if err := holds(ta, "alice", nil)(); err != nil {
		t.Fatalf("the writer's own table: %v", err)
	}
	testutil.Within(t, "b to apply the delete", propagationLimit, holds(tb, "alice", nil))
	if existed, err := a.Delete(ctx, "api", "alice"); err != nil || existed {
		t.Fatalf("Delete again = %v, %v; want false", existed, err)
	}

	want := slices.Repeat([]string{"api/alice"}, 5)
	testutil.Eventually(t, "b's OnChange calls", func() error {
		if got := b.events.changes(); !slices.Equal(got, want) {
			return fmt.Errorf("b told %v, want %v", got, want)
		}
		return nil
	})
	if got := a.events.changes(); len(got) > 0 {
		t.Errorf("the writer was told of its own changes: %v", got)
	}
	if la, lb := a.loads("api"), b.loads("api"); la != 1 || lb != 1 {
		t.Errorf("whole loads: a %d, b %d; want 1 each (every message applied by its key)", la, lb)
	}
	for _, o := range []testOverrides{a, b} {
		if errs := o.events.errors(); len(errs) > 0 {
			t.Errorf("OnError: %v", errs)
		}
	}
}

// TestRedisOverridesZonesApart: zones are sets of their own, whatever
// their names hold; a message on one zone's channel changes nothing in
// another's table.
func TestRedisOverridesZonesApart(t *testing.T) {
	s := redistest.Start(t)
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	b := newTestOverrides(t, s.Client(t), OverridesOptions{})
	zones := []string{"api", "api:x", "{api}", "a#b", "with\nnewline"}
	tables := map[string]*limiter.OverrideTable{}
	for _, z := range zones {
		tables[z] = b.zone(t, z)
	}
	for i, z := range zones {
		o := limiter.Override{Action: limiter.OverrideLimit, Events: int64(i + 1)}
		a.set(t, z, "k", o)
		testutil.Within(t, "b to apply "+z, propagationLimit, holds(tables[z], "k", &o))
	}
	for i, z := range zones {
		got, err := a.List(context.Background(), z)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got["k"].Events != int64(i+1) {
			t.Errorf("List(%q) = %v", z, got)
		}
	}
	if keys := scanKeys(t, s.Client(t)); len(keys) != len(zones) {
		t.Errorf("keys %q, want one per zone", keys)
	}
}

// TestRedisOverridesMissedMessage: a change made while an instance's
// subscription was down, or written without a message, reaches it by the
// version check its resubscription makes, and by the periodic refresh.
func TestRedisOverridesMissedMessage(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	// writeQuietly writes key's record and a new version as the script
	// would, without publishing, as a message lost on the way would look.
	writeQuietly := func(t *testing.T, zone, key string, o limiter.Override) {
		t.Helper()
		rec, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		k := "floodgate:overrides:" + zone
		if err := admin.HSet(ctx, k, key, rec, "", newOverrideVersion()).Err(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("resubscribe", func(t *testing.T) {
		// A refresh of an hour: only the resubscription can bring it.
		b := newTestOverrides(t, s.Client(t), OverridesOptions{Refresh: time.Hour})
		table := b.zone(t, "resub")
		b.subscribed(t, "resub")
		writeQuietly(t, "resub", "bob", tenX)
		time.Sleep(100 * time.Millisecond) // a message would have come by now
		if err := holds(table, "bob", nil)(); err != nil {
			t.Fatalf("applied without a message: %v", err)
		}
		if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		d := testutil.Within(t, "the resubscription's reload", propagationLimit, holds(table, "bob", &tenX))
		testutil.Eventually(t, "the second subscription", func() error {
			if n := b.zones["resub"].subscriptions.Load(); n != 2 {
				return fmt.Errorf("%d subscriptions, want 2", n)
			}
			return nil
		})
		t.Logf("applied %v after CLIENT KILL", d)
		testutil.Eventually(t, "OnChange", func() error {
			if got := b.events.changes(); !slices.Equal(got, []string{"resub/bob"}) {
				return fmt.Errorf("told %v", got)
			}
			return nil
		})
		if len(b.events.errors()) == 0 {
			t.Error("the cut subscription was not reported to OnError")
		}
	})

	t.Run("refresh", func(t *testing.T) {
		b := newTestOverrides(t, s.Client(t), OverridesOptions{Refresh: 200 * time.Millisecond})
		table := b.zone(t, "refresh")
		writeQuietly(t, "refresh", "carol", block)
		d := testutil.Within(t, "the refresh", 2*time.Second, holds(table, "carol", &block))
		t.Logf("applied %v after the quiet write", d)
		// A set deleted whole (as when every record lapsed) empties the
		// table at the next refresh.
		if err := admin.Del(ctx, "floodgate:overrides:refresh").Err(); err != nil {
			t.Fatal(err)
		}
		testutil.Within(t, "the refresh to empty the table", 2*time.Second, holds(table, "carol", nil))
	})

	t.Run("cut, then written", func(t *testing.T) {
		a := newTestOverrides(t, s.Client(t), OverridesOptions{})
		b := newTestOverrides(t, s.Client(t), OverridesOptions{Refresh: 200 * time.Millisecond})
		table := b.zone(t, "cut")
		if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		a.set(t, "cut", "dave", exempt)
		testutil.Within(t, "convergence after the cut", 2*time.Second, holds(table, "dave", &exempt))
	})

	t.Run("a message out of turn", func(t *testing.T) {
		a := newTestOverrides(t, s.Client(t), OverridesOptions{})
		b := newTestOverrides(t, s.Client(t), OverridesOptions{Refresh: time.Hour})
		table := b.zone(t, "turn")
		b.subscribed(t, "turn")
		a.set(t, "turn", "erin", tenX)
		testutil.Within(t, "b to apply", propagationLimit, holds(table, "erin", &tenX))
		// Written quietly, then a message that does not start from b's
		// version: b finds the version moved and reloads.
		writeQuietly(t, "turn", "frank", twoX)
		a.set(t, "turn", "erin", block)
		testutil.Within(t, "b to reload", propagationLimit, func() error {
			if err := holds(table, "frank", &twoX)(); err != nil {
				return err
			}
			return holds(table, "erin", &block)()
		})
		if n := b.loads("turn"); n != 2 {
			t.Errorf("%d whole loads, want 2", n)
		}
	})
}

// TestRedisOverridesLateStart: an instance started after an override was
// set has it when Zone returns, before any request.
func TestRedisOverridesLateStart(t *testing.T) {
	s := redistest.Start(t)
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	a.set(t, "api", "alice", tenX)
	a.set(t, "api", "bob", block) // a zone not open on the writer
	c := newTestOverrides(t, s.Client(t), OverridesOptions{})
	table := c.zone(t, "api")
	for key, o := range map[string]limiter.Override{"alice": tenX, "bob": block} {
		if err := holds(table, key, &o)(); err != nil {
			t.Error(err)
		}
	}
	// A second caller for the zone gets the same table.
	if again := c.zone(t, "api"); again != table {
		t.Error("a second Zone call returned another table")
	}
}

// TestRedisOverridesUnreadable: records that are corrupt, foreign or too
// long, under a key no override may have, or arriving by a message, are
// skipped through OnSkip and never applied; the rest are. A message that
// is not Floodgate's crashes nothing.
func TestRedisOverridesUnreadable(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	a.set(t, "api", "good", tenX)
	k := "floodgate:overrides:api"
	bad := map[string]string{
		"garbage":                    "not json",
		"foreign":                    `{"action":"nuke"}`,
		"no limit":                   `{"action":"limit"}`,
		"block with limit":           `{"action":"block","limit":5}`,
		"long":                       `{"action":"block","x":"` + strings.Repeat("y", 300) + `"}`,
		strings.Repeat("k", 2000):    `{"action":"block"}`,
		"negative window":            `{"action":"limit","limit":5,"window_us":-1}`,
		"window past a year or more": `{"action":"limit","limit":5,"window_us":99999999999999999}`,
		"negative gen":               `{"action":"limit","limit":5,"gen":-1}`,
		"gen past 2^53":              `{"action":"limit","limit":5,"gen":9007199254740992}`,
	}
	for f, v := range bad {
		if err := admin.HSet(ctx, k, f, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b := newTestOverrides(t, s.Client(t), OverridesOptions{})
	table := b.zone(t, "api")
	if err := holds(table, "good", &tenX)(); err != nil {
		t.Error(err)
	}
	if table.Len() != 1 {
		t.Errorf("table holds %d, want only the good one: %v", table.Len(), table.Snapshot())
	}
	if got := b.events.skips(); len(got) != len(bad) {
		t.Errorf("OnSkip told %d, want %d: %q", len(got), len(bad), got)
	}
	list, err := b.List(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list["good"] != tenX {
		t.Errorf("List = %v, want only the good one", list)
	}

	// A corrupt record announced by a message as the script would.
	v, err := admin.HGet(ctx, k, "").Result()
	if err != nil {
		t.Fatal(err)
	}
	next := newOverrideVersion()
	if err := admin.HSet(ctx, k, "good", "{", "", next).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Publish(ctx, k, v+"\n"+next+"\napi\ngood").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.Within(t, "the corrupt record to be dropped", propagationLimit, holds(table, "good", nil))
	// Messages that are not Floodgate's.
	for _, m := range []string{"", "hello", "a\nb", "a\nb\nother\nkey", v + "\n\napi\nx", "x\ny\napi\n"} {
		if err := admin.Publish(ctx, k, m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	a.set(t, "api", "after", block)
	testutil.Within(t, "a change after them", propagationLimit, holds(table, "after", &block))
}

// TestRedisOverridesWrongType: a set's name holding a key of another type
// fails Zone, Set and List with Redis's WRONGTYPE, leaves the table empty
// and the refresh reporting it; nothing panics, and the zone works again
// once the key is deleted.
func TestRedisOverridesWrongType(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	k := "floodgate:overrides:api"
	if err := admin.Set(ctx, k, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	b := newTestOverrides(t, s.Client(t), OverridesOptions{Refresh: 100 * time.Millisecond})
	table, err := b.Zone(ctx, "api")
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Zone = %v, want WRONGTYPE", err)
	}
	if table == nil || table.Len() != 0 {
		t.Fatalf("table %v, want an empty one", table)
	}
	if err := b.Set(ctx, "api", "k", block); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Set = %v, want WRONGTYPE", err)
	}
	if _, err := b.List(ctx, "api"); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("List = %v, want WRONGTYPE", err)
	}
	testutil.Eventually(t, "the refresh to report it", func() error {
		for _, err := range b.events.errors() {
			if strings.Contains(err.Error(), "WRONGTYPE") {
				return nil
			}
		}
		return errors.New("not yet")
	})
	if err := admin.Del(ctx, k).Err(); err != nil {
		t.Fatal(err)
	}
	b.set(t, "api", "k", block)
	testutil.Within(t, "the table after the key was deleted", propagationLimit, holds(table, "k", &block))
}

// TestRedisOverridesExpiry: a set lives in Redis as long as its
// longest-lived record (a margin more), forever once one never lapses; a
// lapsed record is left out of List and of loads and removed from Redis,
// and dropped from the tables by the refresh; an expiry already past is
// refused.
func TestRedisOverridesExpiry(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	// Records keep their expiry to the millisecond.
	clock := testutil.NewClock(time.Now().Truncate(time.Millisecond))
	now := clock.Now()
	a := newTestOverrides(t, s.Client(t), OverridesOptions{Clock: clock})
	b := newTestOverrides(t, s.Client(t), OverridesOptions{Clock: clock, Refresh: 100 * time.Millisecond})
	table := b.zone(t, "api")
	k := "floodgate:overrides:api"
	pttl := func() time.Duration {
		t.Helper()
		d, err := admin.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	inRange := func(what string, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-time.Minute {
			t.Errorf("%s: PTTL %v, want about %v", what, got, want)
		}
	}
	hour := tenX
	hour.Expires = now.Add(time.Hour)
	a.set(t, "api", "hour", hour)
	inRange("a record of an hour", pttl(), time.Hour+overrideExpiryMargin)
	twoHours := block
	twoHours.Expires = now.Add(2 * time.Hour)
	a.set(t, "api", "two hours", twoHours)
	inRange("a longer one", pttl(), 2*time.Hour+overrideExpiryMargin)
	minute := exempt
	minute.Expires = now.Add(time.Minute)
	a.set(t, "api", "minute", minute)
	inRange("a shorter one does not shorten it", pttl(), 2*time.Hour+overrideExpiryMargin)

	testutil.Within(t, "b to apply them", propagationLimit, holds(table, "minute", &minute))
	// A record's expiry is to the millisecond, as given.
	sub := exempt
	sub.Expires = now.Add(time.Hour + 1500*time.Microsecond)
	a.set(t, "api", "sub-ms", sub)
	stored := sub
	stored.Expires = now.Add(time.Hour + time.Millisecond)
	testutil.Within(t, "b to apply it", propagationLimit, holds(table, "sub-ms", &stored))

	clock.Advance(90 * time.Minute)
	list, err := a.List(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := list["hour"]; ok || len(list) != 1 {
		t.Errorf("List after 90 minutes = %v, want only the two hours one", list)
	}
	for _, f := range []string{"hour", "minute"} {
		if ok, err := admin.HExists(ctx, k, f).Result(); err != nil || ok {
			t.Errorf("the lapsed %q is still in Redis (%v)", f, err)
		}
	}
	testutil.Eventually(t, "the refresh to drop the lapsed ones", func() error {
		if table.Len() != 1 {
			return fmt.Errorf("table %v", table.Snapshot())
		}
		return nil
	})
	if got := b.events.changes(); !slices.Contains(got, "api/hour") || !slices.Contains(got, "api/minute") {
		t.Errorf("OnChange told %v, want the lapsed ones among them", got)
	}

	// A record that never lapses makes the set persistent, and it stays
	// so.
	a.set(t, "api", "forever", exempt)
	if d := pttl(); d != -1 {
		t.Errorf("PTTL %v after a record without expiry, want -1 (none)", d)
	}
	a.set(t, "api", "later", twoHours)
	if d := pttl(); d != -1 {
		t.Errorf("PTTL %v after another record with expiry, want -1 (none)", d)
	}

	past := block
	past.Expires = clock.Now().Add(-time.Second)
	if err := a.Set(ctx, "api", "past", past); !errors.Is(err, limiter.ErrInvalidOverride) {
		t.Errorf("Set with an expiry past = %v, want ErrInvalidOverride", err)
	}
}

// TestRedisOverridesRefuses: keys that are empty or too long and
// overrides Check refuses are refused before Redis is asked, and a new
// key in a full zone by the script.
func TestRedisOverridesRefuses(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	a.most = 3 // before any goroutine reads it
	a.zone(t, "api")
	for _, tc := range []struct {
		key string
		o   limiter.Override
	}{
		{"", block},
		{strings.Repeat("k", limiter.MaxOverrideKeyLen+1), block},
		{"k", limiter.Override{}},
		{"k", limiter.Override{Action: limiter.OverrideLimit}},
		{"k", limiter.Override{Action: limiter.OverrideBlock, Events: 3}},
	} {
		if err := a.Set(ctx, "api", tc.key, tc.o); !errors.Is(err, limiter.ErrInvalidOverride) {
			t.Errorf("Set(%.20q, %+v) = %v, want ErrInvalidOverride", tc.key, tc.o, err)
		}
	}
	if _, err := a.Delete(ctx, "api", ""); !errors.Is(err, limiter.ErrInvalidOverride) {
		t.Errorf("Delete of \"\" = %v, want ErrInvalidOverride", err)
	}
	a.set(t, "api", strings.Repeat("k", limiter.MaxOverrideKeyLen), block)

	for _, key := range []string{"b", "c"} {
		a.set(t, "api", key, block)
	}
	if err := a.Set(ctx, "api", "d", block); !errors.Is(err, limiter.ErrTooManyOverrides) {
		t.Errorf("a fourth key = %v, want ErrTooManyOverrides", err)
	}
	a.set(t, "api", "b", exempt) // a key it holds may change
	if _, err := a.Delete(ctx, "api", "c"); err != nil {
		t.Fatal(err)
	}
	a.set(t, "api", "d", block)
	if keys := scanKeys(t, s.Client(t)); len(keys) != 1 {
		t.Errorf("keys %q, want the one set", keys)
	}
}

// TestRedisOverridesConcurrentWriters: two instances writing the same keys
// at once end with tables that match what Redis holds.
func TestRedisOverridesConcurrentWriters(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	inst := []testOverrides{
		newTestOverrides(t, s.Client(t), OverridesOptions{}),
		newTestOverrides(t, s.Client(t), OverridesOptions{}),
		newTestOverrides(t, s.Client(t), OverridesOptions{}),
	}
	tables := make([]*limiter.OverrideTable, len(inst))
	for i, o := range inst {
		tables[i] = o.zone(t, "api")
	}
	var wg sync.WaitGroup
	for i, o := range inst[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range 100 {
				key := fmt.Sprintf("k%d", n%10)
				var err error
				if n%7 == 3 {
					_, err = o.Delete(ctx, "api", key)
				} else {
					err = o.Set(ctx, "api", key, limiter.Override{Action: limiter.OverrideLimit, Events: int64(1 + i*1000 + n)})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	want, err := inst[2].List(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	for i, table := range tables {
		testutil.Within(t, fmt.Sprintf("instance %d to match Redis", i), propagationLimit, func() error {
			if got := table.Snapshot(); !mapsEqual(got, want) {
				return fmt.Errorf("table %v, Redis %v", got, want)
			}
			return nil
		})
	}
}

func mapsEqual(a, b map[string]limiter.Override) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRedisOverridesClusterAndShards: on a Cluster and on shards (a Ring),
// a change set on one instance reaches another within a second, for zones
// whose sets land on different masters or shards.
func TestRedisOverridesClusterAndShards(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	shards := startShards(t, 3)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"cluster", Config{Addresses: cluster.Addrs()}},
		{"shards", Config{Shards: shards.addrs()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestOverrides(t, redisClient(t, tc.cfg), OverridesOptions{})
			b := newTestOverrides(t, redisClient(t, tc.cfg), OverridesOptions{})
			var zones []string
			for i := range 12 {
				zones = append(zones, fmt.Sprintf("z%d", i))
			}
			for _, z := range zones {
				table := b.zone(t, z)
				b.subscribed(t, z)
				a.set(t, z, "alice", tenX)
				testutil.Within(t, z+": the set", propagationLimit, holds(table, "alice", &tenX))
				if _, err := a.Delete(context.Background(), z, "alice"); err != nil {
					t.Fatal(err)
				}
				testutil.Within(t, z+": the delete", propagationLimit, holds(table, "alice", nil))
			}
			if n := b.loads("z0"); n != 1 {
				t.Errorf("%d whole loads, want 1", n)
			}
		})
	}
	// The sets spread over the shards as other keys do.
	var used int
	for _, n := range shards.dbSizes(t) {
		if n > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("the twelve zones' sets are on %d shard(s)", used)
	}
}

// TestRedisOverridesClose: Close ends every goroutine, even while Redis is
// unreachable, and every method fails after it.
func TestRedisOverridesClose(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	check := testutil.GoroutineCheck(t)
	up := redisClient(t, Config{Addresses: []string{s.Addr()}})
	down := redisClient(t, Config{Addresses: []string{testutil.ClosedAddr(t)}})
	for _, client := range []redis.UniversalClient{up, down} {
		r, err := NewOverrides(client, OverridesOptions{Refresh: 50 * time.Millisecond, Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Zone(ctx, "a")
		if (err != nil) != (client == down) {
			t.Errorf("Zone = %v", err)
		}
		r.Zone(ctx, "b")
		time.Sleep(120 * time.Millisecond) // a refresh or two, a failed subscription
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Zone(ctx, "c"); err == nil {
			t.Error("Zone after Close succeeded")
		}
		if err := r.Set(ctx, "a", "k", block); err == nil {
			t.Error("Set after Close succeeded")
		}
		if err := r.Close(); err != nil {
			t.Errorf("a second Close: %v", err)
		}
	}
	up.Close()
	down.Close()
	check()
}

// TestRedisOverridesRefusesClient: a client that ignores context
// deadlines, or none, is refused.
func TestRedisOverridesRefusesClient(t *testing.T) {
	if _, err := NewOverrides(nil, OverridesOptions{}); err == nil {
		t.Error("a nil client was accepted")
	}
	c := redis.NewClient(&redis.Options{Addr: testutil.ClosedAddr(t)})
	defer c.Close()
	if _, err := NewOverrides(c, OverridesOptions{}); err == nil {
		t.Error("a client without ContextTimeoutEnabled was accepted")
	}
}

// TestParseOverrideMessage: the message format, the key last and free.
func TestParseOverrideMessage(t *testing.T) {
	for _, tc := range []struct {
		payload, zone, prev, next, key string
		ok                             bool
	}{
		{"a\nb\napi\nk", "api", "a", "b", "k", true},
		{"\nb\napi\nk", "api", "", "b", "k", true},
		{"a\nb\napi\nk\nwith\nnewlines", "api", "a", "b", "k\nwith\nnewlines", true},
		{"a\nb\nz\none\nk", "z\none", "a", "b", "k", true},
		{"a\nb\nother\nk", "api", "", "", "", false},
		{"a\n\napi\nk", "api", "", "", "", false},
		{"a\nb\napi\n", "api", "", "", "", false},
		{"a\nb", "api", "", "", "", false},
	} {
		prev, next, key, ok := parseOverrideMessage(tc.payload, tc.zone)
		if prev != tc.prev || next != tc.next || key != tc.key || ok != tc.ok {
			t.Errorf("parseOverrideMessage(%q, %q) = %q %q %q %v", tc.payload, tc.zone, prev, next, key, ok)
		}
	}
}

// exerciseRedisOverrides sends, through client, every kind of request
// runtime overrides make: a zone's load and subscription, a set with and
// without expiry, its message to another instance, a list, a delete and
// the pruning of a lapsed record. It returns the first error.
func exerciseRedisOverrides(ctx context.Context, client redis.UniversalClient) error {
	clock := testutil.NewClock(time.Now())
	var mu sync.Mutex
	var errs []error
	opts := OverridesOptions{Clock: clock, OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }}
	a, err := NewOverrides(client, opts)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := NewOverrides(client, opts)
	if err != nil {
		return err
	}
	defer b.Close()
	table, err := b.Zone(ctx, "access-overrides")
	if err != nil {
		return fmt.Errorf("overrides: load: %w", err)
	}
	soon := block
	soon.Expires = clock.Now().Add(time.Minute)
	if err := a.Set(ctx, "access-overrides", "soon", soon); err != nil {
		return fmt.Errorf("overrides: set with expiry: %w", err)
	}
	if err := a.Set(ctx, "access-overrides", "k", tenX); err != nil {
		return fmt.Errorf("overrides: set: %w", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := table.Lookup("k"); ok {
			break
		}
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed || time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Errorf("overrides: the set's message did not reach the other instance: %v", errors.Join(errs...))
		}
	}
	clock.Advance(2 * time.Minute)
	list, err := a.List(ctx, "access-overrides")
	if err != nil {
		return fmt.Errorf("overrides: list: %w", err)
	}
	if len(list) != 1 {
		return fmt.Errorf("overrides: list: %v, want k alone", list)
	}
	if _, err := a.Delete(ctx, "access-overrides", "k"); err != nil {
		return fmt.Errorf("overrides: delete: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("overrides: %w", err)
	}
	return nil
}

// BenchmarkRedisOverridesLoad: a whole load of a zone's set of 100,000
// overrides (HSCAN in chunks and parsing every record), what an instance pays when
// it opens the zone, resubscribes, or finds the version moved without the
// message.
func BenchmarkRedisOverridesLoad(b *testing.B) {
	const n = 100_000
	s := redistest.Start(b)
	ctx := context.Background()
	client := s.Client(b)
	rec, err := limiter.Override{Action: limiter.OverrideLimit, Events: 1000, Window: time.Minute, Expires: time.Now().Add(time.Hour)}.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	key := "floodgate:overrides:api"
	for i := 0; i < n; i += 1000 {
		args := make([]any, 0, 2000)
		for j := i; j < i+1000; j++ {
			args = append(args, fmt.Sprintf("user-%d", 100_000+j), rec)
		}
		if err := client.HSet(ctx, key, args...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	r, err := NewOverrides(client, OverridesOptions{Timeout: time.Minute, Refresh: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	table, err := r.Zone(ctx, "api")
	if err != nil || table.Len() != n {
		b.Fatalf("loaded %d, %v", table.Len(), err)
	}
	z := r.zones["api"]
	for b.Loop() {
		z.mu.Lock()
		_, _, err := z.loadLocked(ctx)
		z.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedisOverridesPropagation: how long a change set on one
// instance takes to be in another's table, over 100 changes on one
// redis-server (the median and the largest, as metrics); the waiting is
// a poll every 20µs, which the figures include.
func BenchmarkRedisOverridesPropagation(b *testing.B) {
	s := redistest.Start(b)
	a := newTestOverrides(b, s.Client(b), OverridesOptions{})
	o := newTestOverrides(b, s.Client(b), OverridesOptions{})
	table := o.zone(b, "api")
	o.subscribed(b, "api")
	ctx := context.Background()
	var delays []time.Duration
	for b.Loop() {
		delays = delays[:0]
		for i := range 100 {
			want := limiter.Override{Action: limiter.OverrideLimit, Events: int64(1 + i), Window: time.Minute}
			start := time.Now()
			if err := a.Set(ctx, "api", "alice", want); err != nil {
				b.Fatal(err)
			}
			for got, _ := table.Lookup("alice"); got != want; got, _ = table.Lookup("alice") {
				if time.Since(start) > testutil.WaitLimit {
					b.Fatalf("change %d not applied", i)
				}
				time.Sleep(20 * time.Microsecond)
			}
			delays = append(delays, time.Since(start))
		}
	}
	slices.Sort(delays)
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "µs-median")
	b.ReportMetric(float64(delays[len(delays)-1].Microseconds()), "µs-max")
}

// TestRedisOverridesRelease: a zone opened twice keeps its subscription
// until both openers release it, then holds none (a zone a reload
// removed costs no connection); opened again, it loads and follows the
// set as ever.
func TestRedisOverridesRelease(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	b := newTestOverrides(t, s.Client(t), OverridesOptions{})
	const channel = "floodgate:overrides:api"
	subscribers := func(want int64) func() error {
		return func() error {
			n, err := admin.PubSubNumSub(ctx, channel).Result()
			if err != nil {
				return err
			}
			if n[channel] != want {
				return fmt.Errorf("%d subscribers on %s, want %d", n[channel], channel, want)
			}
			return nil
		}
	}
	a.zone(t, "api")
	a.zone(t, "api")
	a.subscribed(t, "api")
	a.Release("api")
	testutil.Within(t, "one opener left", time.Second, subscribers(1))
	a.Release("api")
	testutil.Within(t, "the subscription closed", 2*time.Second, subscribers(0))
	a.Release("api") // released already: nothing to do

	b.set(t, "api", "k", tenX)
	table := a.zone(t, "api")
	if err := holds(table, "k", &tenX)(); err != nil {
		t.Errorf("opened again: %v", err)
	}
	a.subscribed(t, "api")
	b.set(t, "api", "k", block)
	testutil.Within(t, "a change after it was opened again", propagationLimit, holds(table, "k", &block))
}

// TestRedisOverridesSetGenReadsAgain: SetGen decides the Gen by the
// record it finds in Redis, and writes only while that record stands.
// Another instance writing the key between the read and the write (here
// from inside keep, which runs between them) makes it read again and
// decide by that writer's record: the same limit keeps that writer's Gen,
// so two writers of one limit never each start the key afresh. Without a
// record, or with a different limit, it draws a new Gen; a nil keep
// writes the Gen given.
func TestRedisOverridesSetGenReadsAgain(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	a := newTestOverrides(t, s.Client(t), OverridesOptions{})
	b := newTestOverrides(t, s.Client(t), OverridesOptions{})
	sameLimit := func(o limiter.Override) limiter.KeepGen {
		return func(old limiter.Override) bool { return old.Events == o.Events && old.Window == o.Window }
	}

	first, err := a.SetGen(ctx, "api", "k", tenX, sameLimit(tenX))
	if err != nil {
		t.Fatal(err)
	}
	if first.Gen == 0 {
		t.Fatal("a new limit got no Gen")
	}
	again, err := a.SetGen(ctx, "api", "k", tenX, sameLimit(tenX))
	if err != nil || again.Gen != first.Gen {
		t.Fatalf("the same limit again: Gen %d (%v), want %d kept", again.Gen, err, first.Gen)
	}

	// b writes tenX with a Gen of its own while a is between its read
	// and its write of tenX.
	theirs := tenX
	theirs.Gen = 12345
	calls := 0
	keep := func(old limiter.Override) bool {
		calls++
		if calls == 1 {
			if err := b.Set(ctx, "api", "raced", theirs); err != nil {
				t.Fatal(err)
			}
			return false
		}
		return sameLimit(tenX)(old)
	}
	if err := a.Set(ctx, "api", "raced", twoX); err != nil {
		t.Fatal(err)
	}
	got, err := a.SetGen(ctx, "api", "raced", tenX, keep)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || got.Gen != theirs.Gen {
		t.Errorf("after a write between its read and its write: keep asked %d times, Gen %d; want 2 and the other writer's %d", calls, got.Gen, theirs.Gen)
	}
	list, err := b.List(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if list["raced"].Gen != theirs.Gen {
		t.Errorf("Redis holds Gen %d, want %d", list["raced"].Gen, theirs.Gen)
	}

	other, err := a.SetGen(ctx, "api", "raced", twoX, sameLimit(twoX))
	if err != nil || other.Gen == theirs.Gen || other.Gen == 0 {
		t.Errorf("a different limit: Gen %d (%v), want a new one", other.Gen, err)
	}
	given, err := a.SetGen(ctx, "api", "raced", twoX, nil)
	if err != nil || given.Gen != twoX.Gen {
		t.Errorf("nil keep: Gen %d (%v), want the one given, %d", given.Gen, err, twoX.Gen)
	}
}

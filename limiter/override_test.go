package limiter_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// Overrides of each kind, as redisstore's overrides tests write them.
var (
	tenX  = limiter.Override{Action: limiter.OverrideLimit, Events: 1000, Window: time.Minute}
	twoX  = limiter.Override{Action: limiter.OverrideLimit, Events: 200, Window: time.Minute, Burst: 20, Gen: limiter.MaxOverrideGen}
	block = limiter.Override{Action: limiter.OverrideBlock}
)

// TestOverrideStateKey: the state names of (key, Gen) pairs with a Gen
// are distinct even for keys that hold NULs and digits, so a limit set
// anew never meets the state of another pair; Gen 0, a record written
// before generations, names the bare key, as its writer did.
func TestOverrideStateKey(t *testing.T) {
	seen := map[string][2]any{}
	for _, key := range []string{"", "a", "a\x00", "a\x001", "a\x00z", "\x00", "1"} {
		o := limiter.Override{Action: limiter.OverrideLimit, Events: 1}
		if got := o.StateKey(key); got != key {
			t.Errorf("Gen 0 names %q's state %q, want the bare key", key, got)
		}
		for _, gen := range []int64{1, 35, 36, limiter.MaxOverrideGen} {
			o.Gen = gen
			name := o.StateKey(key)
			if prev, ok := seen[name]; ok {
				t.Errorf("(%q, %d) and (%q, %d) share the state name %q", key, gen, prev[0], prev[1], name)
			}
			seen[name] = [2]any{key, gen}
		}
	}
}

// TestCheckOverrideKey: an override's key is refused when empty or longer
// than MaxOverrideKeyLen, and the refusal names the bound.
func TestCheckOverrideKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want string // "" for none
	}{
		{"", "needs a key"},
		{"k", ""},
		{"\x00", ""},
		{strings.Repeat("k", limiter.MaxOverrideKeyLen), ""},
		{strings.Repeat("k", limiter.MaxOverrideKeyLen+1), "longer than the 1024"},
	} {
		err := limiter.CheckOverrideKey(tc.key)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckOverrideKey(%.20q) = %v, want %q", tc.key, err, tc.want)
		}
	}
}

// TestOverrideTablePutWithin: writers at once on a table one short of its
// bound add exactly one new key; the others are refused with
// ErrTooManyOverrides, and a key already held may still change.
func TestOverrideTablePutWithin(t *testing.T) {
	const most = 100
	table := limiter.NewOverrideTable()
	for i := range most - 1 {
		if _, err := table.PutWithin(fmt.Sprint("held-", i), tenX, most, nil); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var added atomic.Int64
	for i := range 32 {
		wg.Go(func() {
			_, err := table.PutWithin(fmt.Sprint("new-", i), block, most, nil)
			switch {
			case err == nil:
				added.Add(1)
			case !errors.Is(err, limiter.ErrTooManyOverrides):
				t.Errorf("new-%d: %v, want ErrTooManyOverrides", i, err)
			}
		})
	}
	wg.Wait()
	if added.Load() != 1 || table.Len() != most {
		t.Errorf("%d new keys added, table holds %d; want 1 and %d", added.Load(), table.Len(), most)
	}
	if _, err := table.PutWithin("held-0", twoX, most, nil); err != nil {
		t.Errorf("changing a held key of a full table: %v", err)
	}
}

// TestOverrideTablePutWithinKeepsGen: PutWithin decides the Gen by the
// override the table holds as it puts: a new limit draws one, the same
// limit again keeps it, another limit draws a new one, a block has none,
// and a nil keep puts the Gen given.
func TestOverrideTablePutWithinKeepsGen(t *testing.T) {
	table := limiter.NewOverrideTable()
	same := func(o limiter.Override) limiter.KeepGen {
		return func(old limiter.Override) bool {
			return old.Action == limiter.OverrideLimit && old.Events == o.Events && old.Window == o.Window
		}
	}
	put := func(o limiter.Override, keep limiter.KeepGen) limiter.Override {
		t.Helper()
		got, err := table.PutWithin("k", o, 10, keep)
		if err != nil {
			t.Fatal(err)
		}
		if held, _ := table.Lookup("k"); held != got {
			t.Fatalf("PutWithin returned %+v, the table holds %+v", got, held)
		}
		return got
	}
	first := put(tenX, same(tenX))
	if first.Gen == 0 {
		t.Fatal("a new limit got no Gen")
	}
	if again := put(tenX, same(tenX)); again.Gen != first.Gen {
		t.Errorf("the same limit again: Gen %d, want %d kept", again.Gen, first.Gen)
	}
	other := put(twoX, same(twoX))
	if other.Gen == 0 || other.Gen == first.Gen {
		t.Errorf("another limit: Gen %d, want a new one (not %d)", other.Gen, first.Gen)
	}
	if b := put(block, same(block)); b.Gen != 0 {
		t.Errorf("a block: Gen %d, want 0", b.Gen)
	}
	if back := put(tenX, same(tenX)); back.Gen == 0 || back.Gen == first.Gen {
		t.Errorf("back to the first limit after a block: Gen %d, want a new one (not %d)", back.Gen, first.Gen)
	}
	given := tenX
	given.Gen = 7
	if got := put(given, nil); got.Gen != 7 {
		t.Errorf("nil keep: Gen %d, want the 7 given", got.Gen)
	}
}

// BenchmarkOverrideTableLookup: what a request pays to look its key up in
// its zone's table: an empty table (one atomic load), and a table of
// 100,000 overrides for a key without one and a key with one.
func BenchmarkOverrideTableLookup(b *testing.B) {
	full := storetest.OverrideTableOf(100_000)
	for _, bc := range []struct {
		name  string
		table *limiter.OverrideTable
		key   string
	}{
		{"none/miss", limiter.NewOverrideTable(), "user-999999999"},
		{"100k/miss", full, "user-999999999"},
		{"100k/hit", full, "user-123456"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, ok := bc.table.Lookup(bc.key); ok != strings.HasSuffix(bc.name, "hit") {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}

// BenchmarkOverrideTableMemory reports the heap a table of 100,000
// overrides holds, per override, for keys like "user-123456".
func BenchmarkOverrideTableMemory(b *testing.B) {
	const n = 100_000
	var perOverride float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		t := storetest.OverrideTableOf(n)
		runtime.GC()
		runtime.ReadMemStats(&after)
		perOverride = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(t)
	}
	b.ReportMetric(perOverride, "B/override")
}

package limiter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// prefixModel is what LongestPrefix must answer, by brute force: the
// longest prefix of key, at most most bytes, among the table's.
func prefixModel(all map[string]Override, key string, most int) (string, Override, bool) {
	best, found := "", false
	var bo Override
	for name, o := range all {
		p, ok := OverridePrefix(name)
		if !ok || p == "" || len(p) > most || !strings.HasPrefix(key, p) {
			continue
		}
		if !found || len(p) > len(best) {
			best, bo, found = p, o, true
		}
	}
	return best, bo, found
}

// sameTrie reports how a and b differ as tries ("" when alike): a trie
// changed by writes must be the one a fresh build makes, so no write
// leaves a node that slows every later lookup.
func sameTrie(a, b *prefixNode, path string) string {
	if (a == nil) != (b == nil) {
		return fmt.Sprintf("%q: one is nil", path)
	}
	if a == nil {
		return ""
	}
	if a.label != b.label || a.has != b.has || a.prefix != b.prefix || a.o != b.o || len(a.kids) != len(b.kids) {
		return fmt.Sprintf("%q: label %q/%q has %v/%v prefix %q/%q kids %d/%d", path, a.label, b.label, a.has, b.has, a.prefix, b.prefix, len(a.kids), len(b.kids))
	}
	for i := range len(a.firsts) {
		j := strings.IndexByte(b.firsts, a.firsts[i])
		if j < 0 {
			return fmt.Sprintf("%q: child %q missing", path, a.firsts[i])
		}
		if d := sameTrie(a.kids[i], b.kids[j], path+a.firsts[i:i+1]+a.kids[i].label); d != "" {
			return d
		}
	}
	return ""
}

// TestPrefixTrieAgainstModel: a table under random puts, removals,
// replacements and expiries (of prefixes over a small alphabet, so they
// nest, share edges and split them, with bytes past 0x7f, and of exact
// keys beside them) answers every LongestPrefix as brute force does, at
// every bound, and its trie is the one a fresh build of its prefixes
// makes.
func TestPrefixTrieAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab:\xff"
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	table := NewOverrideTable()
	model := map[string]Override{}
	now := time.UnixMilli(1_800_000_000_000)
	for step := range 4000 {
		o := Override{Action: OverrideLimit, Events: int64(1 + rng.IntN(5)), Gen: int64(step + 1)}
		if rng.IntN(4) == 0 {
			o.Expires = now.Add(time.Duration(rng.IntN(3)-1) * time.Second)
		}
		name := PrefixOverrideName(word(1 + rng.IntN(6)))
		if rng.IntN(5) == 0 {
			name = word(1 + rng.IntN(6))
		}
		switch op := rng.IntN(20); {
		case op < 11:
			table.Put(name, o)
			model[name] = o
		case op < 18:
			if table.Remove(name) != (model[name] != Override{}) {
				t.Fatalf("step %d: Remove(%q) disagrees with the model", step, name)
			}
			delete(model, name)
		case op == 18:
			for _, k := range table.RemoveExpired(now) {
				delete(model, k)
			}
		default:
			all := map[string]Override{}
			for k, v := range model {
				if rng.IntN(3) > 0 {
					all[k] = v
				}
			}
			model = map[string]Override{}
			for k, v := range all {
				model[k] = v
			}
			table.Replace(all)
		}
		var entries []prefixEntry
		for name, o := range model {
			if p, ok := OverridePrefix(name); ok {
				entries = append(entries, prefixEntry{p, o})
			}
		}
		if d := sameTrie(table.prefixes.Load(), buildPrefixes(entries), ""); d != "" {
			t.Fatalf("step %d: the trie differs from a fresh build: %s", step, d)
		}
		if table.Prefixes() != len(entries) || table.Len() != len(model) {
			t.Fatalf("step %d: table counts %d prefixes of %d, model %d of %d", step, table.Prefixes(), table.Len(), len(entries), len(model))
		}
		for range 20 {
			key := word(rng.IntN(9))
			most := len(key)
			if rng.IntN(3) == 0 {
				most = rng.IntN(len(key) + 1)
			}
			gp, gotO, gok := table.LongestPrefix(key, most)
			wp, wo, wok := prefixModel(model, key, most)
			if gp != wp || gotO != wo || gok != wok {
				t.Fatalf("step %d: LongestPrefix(%q, %d) = %q %v %v, want %q %v %v", step, key, most, gp, gotO, gok, wp, wo, wok)
			}
			if o, ok := table.Lookup(key); ok != (model[key] != Override{}) || o != model[key] {
				t.Fatalf("step %d: Lookup(%q) = %v %v, model %v", step, key, o, ok, model[key])
			}
		}
	}
}

// TestPrefixOverridesApartFromKeys: a prefix's override is not a key's
// (Lookup of the prefix itself finds nothing), an empty prefix's name,
// which no writer puts, matches no key, and LongestPrefix neither locks
// nor allocates.
func TestPrefixOverridesApartFromKeys(t *testing.T) {
	table := NewOverrideTable()
	o := Override{Action: OverrideBlock}
	table.Put(PrefixOverrideName("acme:"), o)
	if _, ok := table.Lookup("acme:"); ok {
		t.Error("Lookup of the prefix's text found the prefix's override")
	}
	if _, ok := table.Lookup(PrefixOverrideName("acme:")); ok {
		t.Error("Lookup of the prefix's name found it: it is not a key's")
	}
	if got, ok := table.Get(PrefixOverrideName("acme:")); !ok || got != o {
		t.Error("Get of the prefix's name does not find it")
	}
	table.Put(PrefixOverrideName(""), o)
	if p, _, ok := table.LongestPrefix("globex:1", 8); ok {
		t.Errorf("a key outside acme: matched prefix %q", p)
	}
	if table.Prefixes() != 1 {
		t.Errorf("Prefixes() = %d, want 1 (the empty one is none)", table.Prefixes())
	}
	if allocs := testing.AllocsPerRun(100, func() { table.LongestPrefix("acme:42", 7) }); allocs != 0 {
		t.Errorf("LongestPrefix allocates %v", allocs)
	}
}

// TestPrefixOverridesBound: writers at once on a table one prefix short
// of MaxPrefixOverrides add exactly one new prefix, the others refused
// with ErrTooManyPrefixOverrides; a held prefix may change, and keys'
// overrides are not counted against it.
func TestPrefixOverridesBound(t *testing.T) {
	table := NewOverrideTable()
	all := map[string]Override{}
	for i := range MaxPrefixOverrides - 1 {
		all[PrefixOverrideName(fmt.Sprintf("t%d:", i))] = Override{Action: OverrideBlock}
	}
	all["a-key"] = Override{Action: OverrideBlock}
	table.Replace(all)
	var wg sync.WaitGroup
	var mu sync.Mutex
	added := 0
	for i := range 16 {
		wg.Go(func() {
			_, err := table.PutWithin(PrefixOverrideName(fmt.Sprintf("new%d:", i)), Override{Action: OverrideExempt}, MaxOverrides, nil)
			switch {
			case err == nil:
				mu.Lock()
				added++
				mu.Unlock()
			case !errors.Is(err, ErrTooManyPrefixOverrides):
				t.Errorf("new prefix %d: %v, want ErrTooManyPrefixOverrides", i, err)
			}
		})
	}
	wg.Wait()
	if added != 1 || table.Prefixes() != MaxPrefixOverrides {
		t.Fatalf("%d new prefixes added, %d held; want 1 and %d", added, table.Prefixes(), MaxPrefixOverrides)
	}
	if _, err := table.PutWithin(PrefixOverrideName("t0:"), Override{Action: OverrideExempt}, MaxOverrides, nil); err != nil {
		t.Errorf("changing a held prefix of a full table: %v", err)
	}
	if _, err := table.PutWithin("another-key", Override{Action: OverrideExempt}, MaxOverrides, nil); err != nil {
		t.Errorf("a key's override in a zone full of prefixes: %v", err)
	}
}

// TestCheckOverrideName: a name is refused for an empty key or prefix
// and for one past MaxOverrideKeyLen, a prefix's mark not counted.
func TestCheckOverrideName(t *testing.T) {
	long := strings.Repeat("k", MaxOverrideKeyLen)
	for name, ok := range map[string]bool{
		"": false, "k": true, long: true, long + "k": false,
		PrefixOverrideName(""): false, PrefixOverrideName("a"): true,
		PrefixOverrideName(long): true, PrefixOverrideName(long + "k"): false,
	} {
		if err := CheckOverrideName(name); (err == nil) != ok {
			t.Errorf("CheckOverrideName(%q of %d bytes): %v", name[:min(len(name), 12)], len(name), err)
		}
	}
}

// TestPrefixOverridesReadWhileWritten: requests read the trie without a
// lock while writes replace it (run with -race): every reader finds the
// prefix that is never removed, whatever the writes around it do.
func TestPrefixOverridesReadWhileWritten(t *testing.T) {
	table := NewOverrideTable()
	kept := Override{Action: OverrideLimit, Events: 7}
	table.Put(PrefixOverrideName("acme:"), kept)
	stop := testutil.Repeat(4, func() bool {
		if p, o, ok := table.LongestPrefix("acme:1", 6); !ok || p != "acme:" || o != kept {
			t.Errorf("acme:1 matched %q %+v %v while other prefixes were written", p, o, ok)
			return false
		}
		return true
	})
	for i := range 2000 {
		name := PrefixOverrideName(fmt.Sprintf("acme:%d", i%50+10))
		if i%3 == 0 {
			table.Remove(name)
		} else {
			table.Put(name, Override{Action: OverrideBlock})
		}
		if i%500 == 0 {
			table.Replace(table.Snapshot())
		}
	}
	stop()
}

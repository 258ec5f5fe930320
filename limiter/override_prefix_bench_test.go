package limiter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// prefixTableOf is a table of n prefix overrides, "tenant-0:" on, as a
// zone keyed by "{tenant}:{user}" holds for n upgraded tenants.
func prefixTableOf(n int) *limiter.OverrideTable {
	m := make(map[string]limiter.Override, n)
	for i := range n {
		m[limiter.PrefixOverrideName(fmt.Sprintf("tenant-%d:", i))] = limiter.Override{Action: limiter.OverrideLimit, Events: 1000, Window: time.Minute, Gen: int64(i + 1)}
	}
	t := limiter.NewOverrideTable()
	t.Replace(m)
	return t
}

// BenchmarkOverrideTablePrefixes: what a request pays to find its key's
// prefix override (the table's part of zone.resolve: Lookup, then
// LongestPrefix): on a table without any, and on one of 10,000 for a key
// that starts like none (it leaves the trie at its root), a key of a
// tenant without one (it walks "tenant-" and four digits before it
// leaves), and a key under one.
func BenchmarkOverrideTablePrefixes(b *testing.B) {
	full := prefixTableOf(10_000)
	for _, bc := range []struct {
		name  string
		table *limiter.OverrideTable
		key   string
		hit   bool
	}{
		{"prefixes=0/miss", limiter.NewOverrideTable(), "tenant-12345:user-42", false},
		{"prefixes=10k/miss_other_start", full, "user-42", false},
		{"prefixes=10k/miss_other_tenant", full, "tenant-12345:user-42", false},
		{"prefixes=10k/hit", full, "tenant-4242:user-42", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, ok := bc.table.Lookup(bc.key); ok {
					b.Fatal("a key's own override")
				}
				if _, _, ok := bc.table.LongestPrefix(bc.key, len(bc.key)); ok != bc.hit {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}

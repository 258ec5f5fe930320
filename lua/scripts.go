// Package lua holds the Redis scripts of the Redis store, one per algorithm,
// embedded so a build carries exactly the scripts its Go code was tested with.
//
// Every script decides one request atomically inside Redis with the server's
// TIME as the clock, and mirrors the exact integer arithmetic of the memory
// store in package limiter, so the two stores agree decision for decision.
// The argument and reply layout is documented at the top of each file.
//
// Redis runs one script per call and scripts cannot call one another, so
// what several algorithms share lives in part files that Script joins into
// one source: prelude.lua (arguments, clock, exact division) starts every
// script; bucket.lua (reading the packed state) and bucket_save.lua
// (writing it) surround the two bucket algorithms' own files; window.lua
// (the window index) precedes the two counters'. Each part defines only
// what its scripts use, since the interpreter runs every definition on
// every call. The result is still one atomic EVALSHA per decision.
//
// Batch wraps the same parts as one function called once per operation, so
// several decisions (many give-backs, a give-back and a take on one key, or
// the leases of several keys) run in one call and in order, and the reply
// holds each one's; see batch_open.lua.
//
// Which parts make which algorithm's script is said once, in package
// limiter's algorithm table, so adding an algorithm touches its own .lua
// file and that table, not this package.
//
// Two scripts decide nothing and stand alone, without the prelude:
// time_probe.lua (TimeProbe) and override_set.lua (OverrideSet), which
// writes a zone's runtime overrides.
package lua

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.lua
var files embed.FS

//go:embed time_probe.lua
var timeProbe string

// TimeProbe is the source of the script that tells whether a server lets
// scripts call TIME, which the others read their clock from: it stands
// alone, without prelude.lua, since the prelude's clock is what it checks.
func TimeProbe() string { return timeProbe }

//go:embed override_set.lua
var overrideSet string

// OverrideSet is the source of the script that writes or deletes one
// runtime override in its zone's set, changes the set's version and
// publishes the change, atomically, so every instance learns of exactly
// the writes the set holds (see limiter/redisstore/overrides.go).
func OverrideSet() string { return overrideSet }

// PoolSpend and PoolFill are the sources of the two scripts of a
// region's pool in the regional Redis (limiter/regional, run by
// limiter/redisstore's Pool): spending units from a key's batch or
// claiming its refill, and putting units in (a batch, a give-back, a
// drain of a lapsed batch). Both start with prelude.lua, for the clock.
func PoolSpend() string { return mustJoin("prelude.lua", "pool_spend.lua") }

// PoolFill: see PoolSpend.
func PoolFill() string { return mustJoin("prelude.lua", "pool_fill.lua") }

// mustJoin joins parts named by this package's constants: a missing one
// is a build mistake, which the portability test reports.
func mustJoin(names ...string) string {
	src, err := join(names)
	if err != nil {
		panic(err)
	}
	return src
}

// Script is the source of one script: prelude.lua followed by the named
// files in order. It fails only for a name that is not a file of this
// package, which a test of the algorithm table catches.
func Script(names ...string) (string, error) {
	return join(append([]string{"prelude.lua"}, names...))
}

// Batch is the source of the batch script of the algorithm whose parts are
// names (as for Script): it runs any number of that algorithm's operations,
// on one key or several, in order, and replies with every one's reply (or
// error), in that order.
func Batch(names ...string) (string, error) {
	parts := append([]string{"batch_open.lua", "prelude.lua"}, names...)
	return join(append(parts, "batch_close.lua"))
}

func join(names []string) (string, error) {
	var b strings.Builder
	for _, name := range names {
		src, err := files.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("lua script part %q: %w", name, err)
		}
		b.Write(src)
	}
	return b.String(), nil
}

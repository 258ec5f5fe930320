package limiter

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// benchKeys is how many distinct keys the Take benchmarks spread their
// decisions over: enough that the hash table is realistic, few enough that
// every key exists before the timer starts.
const benchKeys = 1024

// benchPolicy is a policy of algorithm a generous enough that most
// decisions of a benchmark are admissions, so the common path is measured.
func benchPolicy(a Algorithm) Policy {
	p := Policy{Algorithm: a, Events: 1_000_000, Window: time.Second}
	if a == SlidingWindowLog {
		// A log that never expires would grow for the whole run and measure
		// append, not a decision; a short window keeps it small and busy.
		p.Events, p.Window = 64, time.Millisecond
	}
	return p
}

// benchKeySet is benchKeys keys built before any timer runs, so the
// benchmarks measure hashing, lookup and the decision, not string building.
func benchKeySet() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("203.0.113.%d:client-%d", i%256, i)
	}
	return keys
}

// benchStore is a memory store of policy p with every key of keys created.
// Concurrency takes are returned at once so the slots stay free.
func benchStore(b *testing.B, p Policy, keys []string) *Memory {
	b.Helper()
	m, err := NewMemory(p, MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	release := p.Algorithm.Traits().ReleasesOnFinish
	for _, k := range keys {
		decideOnce(ctx, m, k, release)
	}
	return m
}

// decideOnce is one decision on k; for an algorithm whose units are held
// until a request finishes, the request finishes at once (release), so
// the slots stay free.
func decideOnce(ctx context.Context, m *Memory, k string, release bool) {
	d, _ := m.Take(ctx, k, 1)
	if release {
		m.GiveBack(ctx, k, 1, d.Receipt)
	}
}

// BenchmarkMemoryTake is one decision on an existing key from a single
// goroutine. Target for token_bucket: at most 150 ns/op and 0 allocs/op.
func BenchmarkMemoryTake(b *testing.B) {
	keys := benchKeySet()
	for _, a := range Algorithms {
		b.Run(string(a), func(b *testing.B) {
			m := benchStore(b, benchPolicy(a), keys)
			ctx := context.Background()
			release := a.Traits().ReleasesOnFinish
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				decideOnce(ctx, m, keys[i&(benchKeys-1)], release)
				i++
			}
		})
	}
}

// BenchmarkMemoryCharge is one charge of a unit on an existing key from a
// single goroutine, the call a response that cost more than its admission
// took makes after BenchmarkMemoryTake's: it should cost about as much.
func BenchmarkMemoryCharge(b *testing.B) {
	keys := benchKeySet()
	for _, a := range Algorithms {
		if !a.Traits().Charges {
			continue
		}
		b.Run(string(a), func(b *testing.B) {
			m := benchStore(b, benchPolicy(a), keys)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				if _, err := m.Charge(ctx, keys[i&(benchKeys-1)], 1); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkMemoryTakeParallel is BenchmarkMemoryTake from GOMAXPROCS
// goroutines, each walking the key set from its own offset. Target for
// token_bucket on 2 cores: at least 1.5× the single-goroutine throughput.
func BenchmarkMemoryTakeParallel(b *testing.B) {
	keys := benchKeySet()
	for _, a := range Algorithms {
		b.Run(string(a), func(b *testing.B) {
			m := benchStore(b, benchPolicy(a), keys)
			release := a.Traits().ReleasesOnFinish
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				// Start each goroutine far from the others so they do not
				// walk the same keys in lockstep.
				i := int(worker.Add(1)) * 397
				for pb.Next() {
					decideOnce(ctx, m, keys[i&(benchKeys-1)], release)
					i++
				}
			})
		})
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemoryBytesPerKey reports the heap a token-bucket memory store
// holds per key with 1,000,000 keys (target: at most 100 bytes/key). The
// keys are built before the first measurement so only the store is counted.
// Time per op is meaningless here; the metric is bytes/key.
func BenchmarkMemoryBytesPerKey(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	}
	ctx := context.Background()
	var perKey float64
	for b.Loop() {
		before := heapInUse()
		m, err := NewMemory(Policy{Algorithm: TokenBucket, Events: 100, Window: time.Minute},
			MemoryOptions{MaxKeys: 2 * n})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			m.Take(ctx, k, 1)
		}
		after := heapInUse()
		if got := m.Len(); got != n {
			b.Fatalf("store holds %d keys, want %d", got, n)
		}
		perKey = float64(after-before) / n
		runtime.KeepAlive(m)
	}
	runtime.KeepAlive(keys)
	b.ReportMetric(perKey, "bytes/key")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkMemoryBytesPerTimestamp reports the heap a sliding-window-log
// memory store holds per stored admission, with 10,000 keys of 100
// timestamps each (target: at most 16 bytes/timestamp), key and table
// overhead included.
func BenchmarkMemoryBytesPerTimestamp(b *testing.B) {
	const keysN, perKey = 10_000, 100
	keys := make([]string, keysN)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255)
	}
	ctx := context.Background()
	var perTS float64
	for b.Loop() {
		clock := &testutil.Clock{}
		clock.SetMicro(1_700_000_000_000_000)
		before := heapInUse()
		m, err := NewMemory(Policy{Algorithm: SlidingWindowLog, Events: perKey, Window: time.Hour},
			MemoryOptions{MaxKeys: 2 * keysN, Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		// Distinct timestamps, as real traffic gives: one admission per key
		// per millisecond.
		for j := 0; j < perKey; j++ {
			clock.Advance(time.Millisecond)
			for _, k := range keys {
				if d, _ := m.Take(ctx, k, 1); !d.Allowed {
					b.Fatalf("admission %d of %s denied", j, k)
				}
			}
		}
		after := heapInUse()
		perTS = float64(after-before) / (keysN * perKey)
		runtime.KeepAlive(m)
	}
	runtime.KeepAlive(keys)
	b.ReportMetric(perTS, "bytes/timestamp")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkMemoryFixedWindow is BenchmarkMemoryTake's fixed window with a
// window of a day: the baseline of BenchmarkMemoryCalendarWindow.
func BenchmarkMemoryFixedWindow(b *testing.B) {
	benchTakes(b, Policy{Algorithm: FixedWindow, Events: 1_000_000, Window: 24 * time.Hour})
}

// BenchmarkMemoryCalendarWindow is BenchmarkMemoryFixedWindow with calendar
// days in Europe/Berlin instead of a 24-hour window. Target: at most 20%
// more ns/op than the plain window, as the current window is remembered
// and a decision does no time zone arithmetic.
func BenchmarkMemoryCalendarWindow(b *testing.B) {
	berlin := testutil.MustLoad(b, "Europe/Berlin")
	benchTakes(b, Policy{Algorithm: FixedWindow, Events: 1_000_000, Calendar: &Calendar{Period: Day, Location: berlin}})
}

// benchTakes is one decision of p per op on an existing key, from a
// single goroutine.
func benchTakes(b *testing.B, p Policy) {
	keys := benchKeySet()
	m := benchStore(b, p, keys)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		m.Take(ctx, keys[i&(benchKeys-1)], 1)
		i++
	}
}

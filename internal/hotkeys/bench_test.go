package hotkeys

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// benchKeys is a skewed stream of key hashes and texts, built before the
// timer starts so the benchmarks measure Add alone.
type benchKeys struct {
	hashes []uint64
	keys   []string
}

// benchStreamLen is a power of two so a position wraps with a mask.
const benchStreamLen = 1 << 16

func newBenchKeys() benchKeys {
	keyText := make([]string, 100_000)
	for i := range keyText {
		keyText[i] = keyOf(i)
	}
	bk := benchKeys{hashes: make([]uint64, benchStreamLen), keys: make([]string, benchStreamLen)}
	for n, i := range zipfStream(benchStreamLen, len(keyText)) {
		bk.hashes[n], bk.keys[n] = hashOf(i), keyText[i]
	}
	return bk
}

// add feeds the n-th request of the stream to c; one in sixteen is denied.
func (bk benchKeys) add(c *Counter, n int) {
	n &= benchStreamLen - 1
	c.Add(bk.hashes[n], bk.keys[n], n&15 == 0)
}

func BenchmarkAdd(b *testing.B) {
	bk := newBenchKeys()
	c := New(128, nil)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		bk.add(c, n)
		n++
	}
}

func BenchmarkAddParallel(b *testing.B) {
	bk := newBenchKeys()
	c := New(128, nil)
	var offset atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		n := int(offset.Add(benchStreamLen / 8))
		for pb.Next() {
			bk.add(c, n)
			n++
		}
	})
}

// BenchmarkNew reports what one zone's Counter costs: B/op is the whole
// set of counters, B/counter the share of each of its capacity×shards×2
// counters.
func BenchmarkNew(b *testing.B) {
	const capacity = 128
	b.ReportAllocs()
	var c *Counter
	for b.Loop() {
		c = New(capacity, nil)
	}
	b.StopTimer()
	before := liveHeap()
	keep := New(capacity, nil)
	perSet := liveHeap() - before
	runtime.KeepAlive(keep)
	b.ReportMetric(float64(perSet), "B/set")
	b.ReportMetric(float64(perSet)/float64(capacity*len(keep.shards)*2), "B/counter")
	runtime.KeepAlive(c)
}

func BenchmarkTop(b *testing.B) {
	bk := newBenchKeys()
	c := New(128, nil)
	for n := range benchStreamLen {
		bk.add(c, n)
	}
	b.ReportAllocs()
	for b.Loop() {
		c.Top(10)
	}
}

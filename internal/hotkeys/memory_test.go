package hotkeys

import (
	"runtime"
	"testing"
)

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A Counter's memory must not grow with the distinct keys it sees. Each
// key's text is built as it is added, so a Counter that kept more than one
// string per counter (or a map entry per key) would hold megabytes more
// after a million keys than after a thousand.
func TestMemoryConstant(t *testing.T) {
	const capacity, few, many, bound = 128, 1_000, 1_000_000, 64 << 10
	c, _ := newTestCounter(capacity)
	feed := func(from, to int) {
		for i := from; i < to; i++ {
			c.Add(hashOf(i), keyOf(i), false)
		}
	}
	feed(0, few)
	before := liveHeap()
	feed(few, many)
	after := liveHeap()
	runtime.KeepAlive(c)
	t.Logf("live heap after %d keys: %d B; after %d keys: %d B; difference %d B", few, before, many, after, after-before)
	if after-before > bound {
		t.Errorf("heap grew by %d B from %d to %d distinct keys, want under %d B", after-before, few, many, bound)
	}
}

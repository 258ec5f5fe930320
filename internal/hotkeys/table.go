package hotkeys

import "math"

// slot is one counter. count includes err, the count it inherited when its
// key took it over; denied counts only refusals seen since then.
type slot struct {
	hash   uint64
	count  uint64
	err    uint64
	denied uint64
}

// table is one space-saving summary: len(slots) counters, an open-addressing
// index from a key's hash to its slot, and a cursor that finds a counter
// with the smallest count without a heap.
//
// A slot with count 0 is unused and not in the index. Counts only grow
// between resets, which is what makes the cursor work: once the cursor has
// passed a slot whose count is above floor, that slot stays above floor.
type table struct {
	slots []slot
	// keys[i] is the key of slots[i], shown to operators who log keys. It
	// lives apart from slots so the request path, which compares hashes,
	// touches half the memory.
	keys []string
	// index holds slot+1 at the position of the slot's hash (linear
	// probing), 0 where empty. It has at least four times as many positions as
	// there are slots, so probe runs, which a deletion walks, stay short.
	index []uint16
	mask  uint64
	// floor is at most every slot's count, and no slot before next has a
	// count equal to floor.
	floor uint64
	next  int
}

func newTable(capacity int) table {
	size := 2
	for size < 4*capacity {
		size *= 2
	}
	return table{
		slots: make([]slot, capacity),
		keys:  make([]string, capacity),
		index: make([]uint16, size),
		mask:  uint64(size - 1),
	}
}

// add counts one request for the key with this hash, taking over the
// smallest counter if the key has none.
func (t *table) add(hash uint64, key string, denied bool) {
	d := uint64(0)
	if denied {
		d = 1
	}
	if i, ok := t.find(hash); ok {
		s := &t.slots[i]
		s.count++
		s.denied += d
		return
	}
	v := t.victim()
	s := &t.slots[v]
	if s.count != 0 {
		t.unindex(v)
	}
	t.insert(hash, v)
	*s = slot{hash: hash, count: s.count + 1, err: s.count, denied: d}
	t.keys[v] = key
}

// find returns the slot holding hash.
func (t *table) find(hash uint64) (int, bool) {
	for p := hash & t.mask; ; p = (p + 1) & t.mask {
		e := t.index[p]
		if e == 0 {
			return 0, false
		}
		if t.slots[e-1].hash == hash {
			return int(e - 1), true
		}
	}
}

// victim returns a slot with the smallest count. Each full pass of the
// cursor raises floor, and floor never exceeds the updates since the last
// reset divided by the capacity, so the scanning costs O(1) per update on
// average.
func (t *table) victim() int {
	for {
		for ; t.next < len(t.slots); t.next++ {
			if t.slots[t.next].count == t.floor {
				return t.next
			}
		}
		t.floor = t.min()
		t.next = 0
	}
}

// min is the smallest count: 0 while a slot is unused, since then nothing
// was ever evicted. A key without a counter was seen at most min times.
func (t *table) min() uint64 {
	m := uint64(math.MaxUint64)
	for i := range t.slots {
		m = min(m, t.slots[i].count)
	}
	return m
}

// insert records in the index that slot v holds hash.
func (t *table) insert(hash uint64, v int) {
	p := hash & t.mask
	for t.index[p] != 0 {
		p = (p + 1) & t.mask
	}
	t.index[p] = uint16(v + 1)
}

// unindex removes slot v from the index, shifting later entries of its
// probe run back so that find, which stops at the first empty position,
// still reaches them.
func (t *table) unindex(v int) {
	p := t.slots[v].hash & t.mask
	for int(t.index[p]) != v+1 {
		p = (p + 1) & t.mask
	}
	for j := (p + 1) & t.mask; t.index[j] != 0; j = (j + 1) & t.mask {
		home := t.slots[t.index[j]-1].hash & t.mask
		// The entry at j may move to p if p lies on its probe run, from
		// home to j.
		if (j-home)&t.mask >= (j-p)&t.mask {
			t.index[p] = t.index[j]
			p = j
		}
	}
	t.index[p] = 0
}

// reset forgets every count, and the keys with them so the collector can
// free them.
func (t *table) reset() {
	clear(t.slots)
	clear(t.keys)
	clear(t.index)
	t.floor, t.next = 0, 0
}

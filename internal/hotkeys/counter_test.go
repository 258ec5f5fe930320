package hotkeys

import (
	"slices"
	"testing"
)

func TestExactUpToCapacity(t *testing.T) {
	const capacity = 64
	for _, tc := range []struct {
		name string
		hash func(int) uint64
	}{
		{"spread over shards", hashOf},
		// Every key on one shard: still exact, as each shard has the
		// full capacity.
		{"one shard", oneShard},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newTestCounter(capacity)
			for i := range capacity {
				for r := range i + 1 {
					c.Add(tc.hash(i), keyOf(i), r%3 == 0)
				}
			}
			got := c.Top(2 * capacity)
			if len(got) != capacity {
				t.Fatalf("Top returned %d entries, want %d", len(got), capacity)
			}
			for rank, e := range got {
				i := capacity - 1 - rank
				want := Entry{Hash: tc.hash(i), Key: keyOf(i), Requests: uint64(i + 1), Denied: uint64(i/3 + 1)}
				if e != want {
					t.Errorf("rank %d: got %+v, want %+v", rank, e, want)
				}
			}
		})
	}
}

func TestTopLength(t *testing.T) {
	c, _ := newTestCounter(4)
	if got := c.Top(10); got != nil {
		t.Fatalf("Top of an empty counter = %v, want nil", got)
	}
	for i := range 1000 {
		c.Add(hashOf(i%50), keyOf(i%50), false)
	}
	for _, tc := range []struct{ n, want int }{{-1, 0}, {0, 0}, {3, 3}, {4, 4}, {10, 4}} {
		if got := len(c.Top(tc.n)); got != tc.want {
			t.Errorf("len(Top(%d)) = %d, want %d (capacity 4)", tc.n, got, tc.want)
		}
	}
}

// With far more keys than counters and a generation change in the middle,
// every reported count must still bracket the truth as documented.
func TestBoundsWithMoreKeysThanCounters(t *testing.T) {
	const capacity, keys, updates = 8, 500, 40_000
	c, clock := newTestCounter(capacity)
	tr := newTruth(hashOf)
	stream := zipfStream(updates, keys)
	for n, i := range stream {
		if n == updates/2 {
			clock.Advance(generation)
			c.Rotate()
		}
		tr.add(c, i, n%7 == 0)
	}
	got := c.Top(capacity)
	if len(got) != capacity {
		t.Fatalf("Top returned %d entries, want %d", len(got), capacity)
	}
	checkBounds(t, got, tr, updates, capacity)
}

// A key that lost its counter in one generation, or never had one there,
// may have been seen there as often as that generation's smallest count:
// Top must add that to Requests and Error, or Requests undercounts.
func TestBoundsAcrossGenerations(t *testing.T) {
	c, clock := newTestCounter(2)
	tr := newTruth(oneShard)
	tr.add(c, 1, true)
	tr.add(c, 2, false)
	for range 5 {
		tr.add(c, 3, false) // takes key 1's counter: 1 inherited + 5
	}
	clock.Advance(generation)
	c.Rotate()
	for range 3 {
		tr.add(c, 1, true) // a fresh counter in the new generation
	}
	got := c.Top(2)
	checkBounds(t, got, tr, 10, 2)
	want := []Entry{
		{Hash: oneShard(3), Key: keyOf(3), Requests: 6, Error: 1},
		// 3 here, plus the old generation's smallest count (key 2's 1).
		{Hash: oneShard(1), Key: keyOf(1), Requests: 4, Denied: 3, Error: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Top(2) = %+v, want %+v", got, want)
	}
}

// The true ten busiest keys of a skewed stream of a million requests over
// 100,000 keys must all be in Top(10), with counts within their bounds.
func TestZipfFindsTopKeys(t *testing.T) {
	const capacity, keys, updates = 128, 100_000, 1_000_000
	c, _ := newTestCounter(capacity)
	tr := newTruth(hashOf)
	for n, i := range zipfStream(updates, keys) {
		tr.add(c, i, n%5 == 0)
	}
	want := make([]uint64, 0, len(tr.requests))
	for h := range tr.requests {
		want = append(want, h)
	}
	slices.SortFunc(want, func(a, b uint64) int { return int(tr.requests[b]) - int(tr.requests[a]) })
	got := c.Top(10)
	checkBounds(t, got, tr, updates, capacity)
	for rank, h := range want[:10] {
		if !slices.ContainsFunc(got, func(e Entry) bool { return e.Hash == h }) {
			t.Errorf("true rank %d (%d requests) missing from Top(10) = %+v", rank, tr.requests[h], got)
		}
	}
}

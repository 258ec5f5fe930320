package hotkeys

import (
	"testing"
	"time"
)

// requestsOf returns the requests Top reports for key number i, 0 if absent.
func requestsOf(c *Counter, i int) uint64 {
	for _, e := range c.Top(MaxCapacity) {
		if e.Hash == hashOf(i) {
			return e.Requests
		}
	}
	return 0
}

func TestRotationForgetsAfterAMinute(t *testing.T) {
	c, clock := newTestCounter(16)
	step := func(d time.Duration, add int, want map[int]uint64) {
		t.Helper()
		clock.Advance(d)
		c.Rotate()
		for range add {
			c.Add(hashOf(add), keyOf(add), false)
		}
		for i, n := range want {
			if got := requestsOf(c, i); got != n {
				t.Errorf("at +%v key %d: %d requests, want %d", clock.Now().Sub(start), i, got, n)
			}
		}
	}
	// Key k is added k times, so counts name their key.
	step(0, 1, map[int]uint64{1: 1})
	step(29*time.Second, 2, map[int]uint64{1: 1, 2: 2})
	// Both in the previous generation now, within the minute.
	step(time.Second, 3, map[int]uint64{1: 1, 2: 2, 3: 3})
	step(29*time.Second+999*time.Millisecond, 0, map[int]uint64{1: 1, 2: 2, 3: 3})
	// A minute after key 1: the first generation is gone; key 3's stays.
	step(time.Millisecond, 4, map[int]uint64{1: 0, 2: 0, 3: 3, 4: 4})
	step(30*time.Second, 0, map[int]uint64{3: 0, 4: 4})
	// A jump of minutes forgets everything.
	step(5*time.Minute, 0, map[int]uint64{4: 0})
	if got := c.Top(10); got != nil {
		t.Errorf("Top after five idle minutes = %+v, want nil", got)
	}
}

// Add follows the generation Top and Rotate publish, without reading the
// clock; a clock moved backwards does not bring old counts back.
func TestAddFollowsRotate(t *testing.T) {
	c, clock := newTestCounter(16)
	c.Add(hashOf(1), keyOf(1), true)
	clock.Advance(time.Minute)
	// Not rotated yet: this lands in the old generation...
	c.Add(hashOf(2), keyOf(2), false)
	// ...which Top forgets, having read the clock.
	if got := c.Top(10); got != nil {
		t.Fatalf("Top = %+v, want nil", got)
	}
	c.Add(hashOf(3), keyOf(3), false)
	clock.Set(start)
	if got := requestsOf(c, 3); got != 1 {
		t.Errorf("key 3 after the clock went back: %d requests, want 1", got)
	}
}

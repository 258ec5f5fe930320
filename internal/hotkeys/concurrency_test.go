package hotkeys

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// Many goroutines add while others read Top and rotate; run with -race.
// With no more keys than counters and the clock still, every request must
// be counted exactly.
func TestConcurrentAddAndTop(t *testing.T) {
	const capacity, keys, writers, perWriter = 128, 100, 8, 20_000
	c, _ := newTestCounter(capacity)
	stop := testutil.Repeat(2, func() bool {
		top := c.Top(10)
		if len(top) > 10 || !slices.IsSortedFunc(top, func(a, b Entry) int { return int(b.Requests) - int(a.Requests) }) {
			t.Errorf("Top(10) during adds: %+v", top)
		}
		c.Rotate()
		return true
	})
	var writersWG sync.WaitGroup
	for w := range writers {
		writersWG.Go(func() {
			for n := range perWriter {
				i := (n*7 + w) % keys
				c.Add(hashOf(i), keyOf(i), n%2 == 0)
			}
		})
	}
	writersWG.Wait()
	stop()

	var total uint64
	for _, e := range c.Top(capacity) {
		if e.Error != 0 {
			t.Errorf("%s: error %d with fewer keys than counters", e.Key, e.Error)
		}
		total += e.Requests
	}
	if total != writers*perWriter {
		t.Errorf("counted %d requests, want %d", total, writers*perWriter)
	}
}

// Adds racing with generation changes must not corrupt a table: every
// entry Top returns afterwards still has a key and a count.
func TestConcurrentRotation(t *testing.T) {
	c, clock := newTestCounter(32)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for n := range 20_000 {
				i := (n*13 + w) % 200
				c.Add(hashOf(i), keyOf(i), false)
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			clock.Advance(time.Second)
			c.Top(5)
		}
	})
	wg.Wait()
	for _, e := range c.Top(32) {
		if e.Key == "" || e.Requests == 0 || e.Requests < e.Error {
			t.Errorf("entry after concurrent rotation: %+v", e)
		}
	}
}

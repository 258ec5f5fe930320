package hotkeys

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// start is where every test's clock begins.
var start = time.Unix(1_700_000_000, 0)

// hashOf spreads key number i over 64 bits (the splitmix64 finalizer), as
// the handler's key hash would, so keys land on every shard.
func hashOf(i int) uint64 {
	z := uint64(i) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// keyOf is key number i's text.
func keyOf(i int) string { return "client-" + strconv.Itoa(i) }

// zipfStream returns n key numbers in [0, keys) drawn from a Zipf
// distribution with exponent 1.1, the skew of real client traffic, from a
// fixed seed so failures repeat.
func zipfStream(n, keys int) []int {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(keys-1))
	out := make([]int, n)
	for i := range out {
		out[i] = int(z.Uint64())
	}
	return out
}

// truth counts a stream exactly, the reference Top is checked against.
type truth struct {
	requests, denied map[uint64]uint64
	hash             func(int) uint64
}

func newTruth(hash func(int) uint64) truth {
	return truth{requests: map[uint64]uint64{}, denied: map[uint64]uint64{}, hash: hash}
}

// oneShard is hashOf with the top bits cleared, putting every key on the
// first shard, to test a table at its limits.
func oneShard(i int) uint64 { return hashOf(i) >> shardBits }

// add feeds one request to both c and the exact count.
func (tr truth) add(c *Counter, i int, denied bool) {
	h := tr.hash(i)
	c.Add(h, keyOf(i), denied)
	tr.requests[h]++
	if denied {
		tr.denied[h]++
	}
}

// checkBounds fails t unless every entry brackets the true counts as Entry
// documents, with an Error no larger than total/capacity.
func checkBounds(t *testing.T, entries []Entry, tr truth, total, capacity uint64) {
	t.Helper()
	for _, e := range entries {
		req, den := tr.requests[e.Hash], tr.denied[e.Hash]
		if e.Requests < req || e.Requests-e.Error > req {
			t.Errorf("%s: requests %d error %d, true %d outside [Requests-Error, Requests]", e.Key, e.Requests, e.Error, req)
		}
		if e.Denied > den || e.Denied+e.Error < den {
			t.Errorf("%s: denied %d error %d, true %d outside [Denied, Denied+Error]", e.Key, e.Denied, e.Error, den)
		}
		if e.Error > total/capacity {
			t.Errorf("%s: error %d above updates/capacity = %d/%d", e.Key, e.Error, total, capacity)
		}
	}
}

// newTestCounter returns a Counter of capacity on a clock the test moves.
func newTestCounter(capacity int) (*Counter, *testutil.Clock) {
	clock := testutil.NewClock(start)
	return New(capacity, clock), clock
}

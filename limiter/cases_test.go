package limiter_test

import (
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestAlgorithmCasesMemory runs the table of algorithm cases
// (testdata/algorithm_cases.json) against the memory store; the Redis
// store's tests run it against Redis, which must agree decision for
// decision.
func TestAlgorithmCasesMemory(t *testing.T) {
	storetest.RunAlgorithmCases(t, func(t *testing.T, p limiter.Policy) (limiter.Store, func(int64)) {
		clock := &testutil.Clock{}
		m, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return m, clock.SetMicro
	})
}

// TestResetCasesMemory runs the shared cases of give-backs across an admin
// reset (storetest.RunResetCases) against the memory store, on a clock
// that stands still; the Redis store's tests run them against Redis.
func TestResetCasesMemory(t *testing.T) {
	storetest.RunResetCases(t, func(t *testing.T, p limiter.Policy) (limiter.Store, func(int64)) {
		clock := &testutil.Clock{}
		m, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return m, clock.SetMicro
	})
}

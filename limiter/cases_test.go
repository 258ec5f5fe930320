package limiter_test

import (
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// memoryCaseStore opens a memory store for one shared case, on a manual
// clock the case sets.
func memoryCaseStore(t *testing.T, p limiter.Policy) (limiter.Store, func(int64)) {
	clock := &testutil.Clock{}
	m, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return m, clock.SetMicro
}

// TestAlgorithmCasesMemory runs the table of algorithm cases
// (testdata/algorithm_cases.json) against the memory store; the Redis
// store's tests run it against Redis, which must agree decision for
// decision.
func TestAlgorithmCasesMemory(t *testing.T) {
	storetest.RunAlgorithmCases(t, memoryCaseStore)
}

// TestCostBelowOneMemory: the memory store refuses a cost below 1 with
// an error, as the other stores do (storetest.RunCostBelowOneCases).
func TestCostBelowOneMemory(t *testing.T) {
	storetest.RunCostBelowOneCases(t, memoryCaseStore)
}

// TestResetCasesMemory runs the shared cases of give-backs across an admin
// reset (storetest.RunResetCases) against the memory store, on a clock
// that stands still; the Redis store's tests run them against Redis.
func TestResetCasesMemory(t *testing.T) {
	storetest.RunResetCases(t, memoryCaseStore)
}

// TestChargeReceiptNamesItsState: a memory charge's receipt carries the
// epoch of the state it charged, as a take's does and as the Redis
// store's charge does (its reply ends with the epoch); the Redis store's
// tests run the same cases (storetest.RunChargeReceiptCases).
func TestChargeReceiptNamesItsState(t *testing.T) {
	storetest.RunChargeReceiptCases(t, memoryCaseStore)
}

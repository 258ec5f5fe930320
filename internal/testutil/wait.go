package testutil

import (
	"runtime"
	"testing"
	"time"
)

// WaitLimit bounds every wait in this package. It is generous on purpose:
// a condition that holds is seen within milliseconds on an idle machine,
// and the limit only decides how long a failing test takes to say so, so
// it leaves room for a machine whose cores are all busy.
const WaitLimit = 10 * time.Second

// pollEvery is how often a wait checks its condition again.
const pollEvery = 5 * time.Millisecond

// Eventually waits until cond returns nil, failing t with what and cond's
// last error if it does not within WaitLimit. The error says why the
// condition does not hold yet, so a failure shows the state it was stuck in.
func Eventually(t testing.TB, what string, cond func() error) {
	t.Helper()
	Within(t, what, WaitLimit, cond)
}

// Within is Eventually with a limit the test asserts (say, that decisions
// resume within 2 s of a failover), and reports how long cond took to
// hold, for the test's log.
func Within(t testing.TB, what string, limit time.Duration, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("timed out after %v waiting for %s: %v", limit, what, err)
		}
		time.Sleep(pollEvery)
	}
}

// GoroutineCheck records how many goroutines run now; the function it
// returns fails t, with every goroutine's stack, unless their number
// falls back to that within WaitLimit. Call it before starting what must
// not leak and run the check once that is stopped.
func GoroutineCheck(t testing.TB) (check func()) {
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(WaitLimit)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(pollEvery)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines still running, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	}
}

package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestChargeReceiptNamesItsState: a memory charge's receipt carries the epoch of the state it charged (Receipt.Epoch), as a take's
// does and as the Redis store's charge does (its reply ends with the
// epoch). With Epoch 0 ("names no state") a give-back by that receipt
// after an admin reset is credited to the fresh state: over-admission,
// and a decision the Redis store makes differently.
func TestChargeReceiptNamesItsState(t *testing.T) {
	for _, alg := range limiter.Algorithms {
		if !alg.Traits().Charges {
			continue
		}
		t.Run(string(alg), func(t *testing.T) {
			p := limiter.Policy{Algorithm: alg, Events: 5, Window: time.Hour}
			clock := &testutil.Clock{}
			clock.SetMicro(storetest.AlignedBase(p))
			m, err := limiter.NewMemory(p, limiter.MemoryOptions{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			take := storetest.MustAdmit(t, m, "k")
			ch, err := m.Charge(ctx, "k", 2)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Receipt.Epoch != take.Receipt.Epoch {
				t.Errorf("charge's receipt epoch %d, the take's on the same state %d", ch.Receipt.Epoch, take.Receipt.Epoch)
			}
			if _, err := m.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if n := storetest.AdmitAll(t, m, "k", 8); n != 5 {
				t.Fatalf("admitted %d after the reset, want 5", n)
			}
			if _, err := m.GiveBack(ctx, "k", ch.Receipt.Granted, ch.Receipt); err != nil {
				t.Fatal(err)
			}
			if n := storetest.AdmitAll(t, m, "k", 8); n != 0 {
				t.Errorf("a give-back of %d units charged before the reset let %d more in; want none", ch.Receipt.Granted, n)
			}
		})
	}
}

package regional

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// TestChargeFromBatchNamesItsEpoch: a charge the region's batch pays
// in full is answered with a receipt built by hand (Store.Charge), which
// must keep the batch's Epoch with At and Mark. With Epoch 0 (names no
// state) a give-back by that receipt after an admin reset would be taken
// by a batch of the fresh state granted under the same mark (a still
// clock), or by global's fresh state: units counted before the reset
// would reach the state after it, as
// TestResetDropsGiveBackOfABatchGrantedBeforeIt shows a take's do not.
func TestChargeFromBatchNamesItsEpoch(t *testing.T) {
	ctx := context.Background()
	for _, alg := range Algorithms() {
		if !alg.Traits().Charges {
			continue
		}
		for _, into := range []string{"global", "batch"} {
			t.Run(string(alg)+"/"+into, func(t *testing.T) {
				r := newDrainRegion(t, limiter.Policy{Algorithm: alg, Events: 4, Window: time.Hour})
				s := r.store(r.pool, nil)
				take := storetest.MustAdmit(t, s, "k") // a batch, with units to spare
				ch, err := s.Charge(ctx, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if ch.Receipt.Epoch != take.Receipt.Epoch {
					t.Errorf("the charge's receipt names epoch %d, the take's from the same batch %d", ch.Receipt.Epoch, take.Receipt.Epoch)
				}
				if _, err := s.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				var n int64
				if into == "batch" {
					storetest.MustAdmit(t, s, "k")
					n++
				} else {
					n += storetest.AdmitAll(t, s, "k", 8)
					r.clock.Advance(denyFor + time.Millisecond)
				}
				if _, err := s.GiveBack(ctx, "k", 1, ch.Receipt); err != nil {
					t.Fatal(err)
				}
				if n += storetest.AdmitAll(t, s, "k", 8); n != 4 {
					t.Errorf("admitted %d after the reset, want the limit 4: a unit charged before it came back", n)
				}
			})
		}
	}
}

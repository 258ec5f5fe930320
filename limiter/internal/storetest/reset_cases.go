package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// resetLimit is the limit of the reset cases' policies.
const resetLimit = 5

// resetWays are the ways units taken before a reset come back after it:
// each gives back the units of before (of key "k") to s, after a reset of
// the key when reset is set, and reports an admission the call made too
// (Renew's), if any.
var resetWays = []struct {
	name   string
	leases bool // the way needs a Leaser whose algorithm leases
	back   func(t *testing.T, s limiter.Store, before *limiter.Admission, reset bool) limiter.Admission
}{
	{"give-back", false, func(t *testing.T, _ limiter.Store, before *limiter.Admission, reset bool) limiter.Admission {
		d, err := before.Release(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// A give-back to a state that did not count the units reports
		// the key's state as it is: the fresh state is full.
		if reset && d.Remaining != 0 {
			t.Errorf("the dropped give-back reports remaining %d, want the fresh state's 0", d.Remaining)
		}
		return limiter.Admission{}
	}},
	{"return-many", true, func(t *testing.T, s limiter.Store, before *limiter.Admission, _ bool) limiter.Admission {
		r := limiter.Return{Key: "k", Units: before.Held(), Taken: before.Receipt}
		if err := s.(limiter.Leaser).ReturnMany(context.Background(), []limiter.Return{r}); err != nil {
			t.Fatal(err)
		}
		return limiter.Admission{}
	}},
	{"renew", true, func(t *testing.T, s limiter.Store, before *limiter.Admission, _ bool) limiter.Admission {
		r := limiter.Return{Key: "k", Units: before.Held(), Taken: before.Receipt}
		a, err := s.(limiter.Leaser).Renew(context.Background(), r, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}},
	{"lease-many", true, func(t *testing.T, s limiter.Store, before *limiter.Admission, _ bool) limiter.Admission {
		lb, ok := s.(limiter.LeaseBatcher)
		if !ok {
			t.Skipf("a %T takes no leases in batches", s)
		}
		r := limiter.Return{Key: "k", Units: before.Held(), Taken: before.Receipt}
		answers := lb.LeaseMany(context.Background(), []limiter.LeaseAsk{{Key: "k", Cost: 1, Want: 1, Back: r}})
		if answers[0].Err != nil {
			t.Fatal(answers[0].Err)
		}
		return answers[0].Admission
	}},
}

// RunResetCases checks, for every algorithm and every way units come
// back (a give-back; for the algorithms that lease, a return, a renewal
// and a batch of leases), that units taken before an admin reset never
// reach the state the reset began: a key admits its limit after a reset,
// not one unit more, whatever the requests in flight at the reset give
// back (docs/design.md, "Exact where features meet"). The clock stands
// still throughout: the state before the reset and the state after it
// are told apart by what they are, not by their times. A take of one
// unit and a lease of two (where the algorithm leases) are given back.
// Before the reset, each way's give-back must reach the state, or the
// cases could pass with a store that drops every give-back.
func RunResetCases(t *testing.T, open CaseStore) {
	for _, alg := range limiter.Algorithms {
		p := limiter.Policy{Algorithm: alg, Events: resetLimit, Window: time.Hour}
		for _, way := range resetWays {
			if way.leases && !alg.Traits().Leases {
				continue
			}
			for _, want := range []int64{1, 2} {
				if want > 1 && !alg.Traits().Leases {
					continue
				}
				name := string(alg) + "/" + way.name + "/take"
				if want > 1 {
					name = string(alg) + "/" + way.name + "/lease"
				}
				t.Run(name, func(t *testing.T) {
					store, setNow := open(t, p)
					setNow(AlignedBase(p))
					ctx := context.Background()
					take := func() limiter.Admission {
						t.Helper()
						var a limiter.Admission
						var err error
						if want > 1 {
							a, err = store.(limiter.Leaser).TakeUpTo(ctx, "k", 1, want)
						} else {
							a, err = store.Take(ctx, "k", 1)
						}
						if err != nil || !a.Allowed {
							t.Fatalf("take before the reset: %+v, %v", a, err)
						}
						return a
					}

					// The same state: the units come back.
					first := take()
					admitted := AdmitAll(t, store, "k", resetLimit+3)
					if held := first.Held(); admitted != resetLimit-held {
						t.Fatalf("admitted %d beside %d held, want %d", admitted, held, resetLimit-held)
					}
					extra := way.back(t, store, &first, false)
					again := AdmitAll(t, store, "k", resetLimit+3)
					if extra.Allowed {
						again += extra.Held()
					}
					if again != want {
						t.Fatalf("after giving back %d units to the state that took them, %d admitted; want them back", want, again)
					}

					// After a reset: they do not.
					if _, err := store.Reset(ctx, "k"); err != nil {
						t.Fatal(err)
					}
					before := take()
					if _, err := store.Reset(ctx, "k"); err != nil {
						t.Fatal(err)
					}
					if n := AdmitAll(t, store, "k", resetLimit+3); n != resetLimit {
						t.Fatalf("admitted %d after the reset, want the limit %d", n, resetLimit)
					}
					extra = way.back(t, store, &before, true)
					n := AdmitAll(t, store, "k", resetLimit+3)
					if extra.Allowed {
						n += extra.Held()
					}
					if n != 0 {
						t.Errorf("after a give-back of %d units taken before the reset, %d more admitted; want none: the fresh state never counted them", want, n)
					}
				})
			}
		}
	}
}

// RunChargeReceiptCases checks, for every algorithm that charges, that a
// charge's receipt carries the epoch of the state it charged
// (Receipt.Epoch), as a take's does, so a give-back by that receipt after
// an admin reset is dropped. With Epoch 0 ("names no state") it would be
// credited to the fresh state: over-admission, and a decision the memory
// and the Redis store would make differently.
func RunChargeReceiptCases(t *testing.T, open CaseStore) {
	for _, alg := range limiter.Algorithms {
		if !alg.Traits().Charges {
			continue
		}
		t.Run(string(alg), func(t *testing.T) {
			p := limiter.Policy{Algorithm: alg, Events: resetLimit, Window: time.Hour}
			s, setNow := open(t, p)
			setNow(AlignedBase(p))
			ctx := context.Background()
			take := MustAdmit(t, s, "k")
			ch, err := s.(limiter.Charger).Charge(ctx, "k", 2)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Receipt.Epoch != take.Receipt.Epoch {
				t.Errorf("charge's receipt epoch %d, the take's on the same state %d", ch.Receipt.Epoch, take.Receipt.Epoch)
			}
			if _, err := s.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if n := AdmitAll(t, s, "k", resetLimit+3); n != resetLimit {
				t.Fatalf("admitted %d after the reset, want %d", n, resetLimit)
			}
			if _, err := s.GiveBack(ctx, "k", ch.Receipt.Granted, ch.Receipt); err != nil {
				t.Fatal(err)
			}
			if n := AdmitAll(t, s, "k", resetLimit+3); n != 0 {
				t.Errorf("a give-back of %d units charged before the reset let %d more in; want none", ch.Receipt.Granted, n)
			}
		})
	}
}

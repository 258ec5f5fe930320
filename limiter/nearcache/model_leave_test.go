package nearcache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// queuedBacks is how many asks queued in c's lanes carry a give-back
// (a renewal's), each holding its shard's backs lock.
func (c *Cache) queuedBacks() int {
	n := 0
	for i := range c.lanes {
		l := &c.lanes[i]
		l.mu.Lock()
		for _, a := range l.queue {
			if a.Back.Units > 0 {
				n++
			}
		}
		l.mu.Unlock()
	}
	return n
}

// Requests that leave their lane's queue (lanes.go: a request whose
// context ends while its lease request waits) in TestModel: a burst's
// queued requests may leave (modelRun.burst), and leftAnswered notes
// what their refills bring.

// leftAnswered notes the answer to the refill of t, a burst's request
// that left its lane's queue, once its group was delivered to instance
// inst of generation gi, whose leases of t's key were before before it
// was. The store's grant becomes the key's lease, whole (nearAsk.left):
// its grant counts where the store decided it, as a refill ahead's, and
// later requests spend it. When the key was reset on the instance since
// the store decided, the cache keeps nothing of it (the reset erased its
// units with the state it forgot); when the cache closed meanwhile, or
// the grant is a sliding log's the store did not log ahead (later
// requests may not spend it: Cache.spendsAhead), it went back.
func (m *modelRun) leftAnswered(gi, inst int, grp *modelGroup, t *modelBurstTake, before [2]modelLease) {
	if m.failure != "" {
		return
	}
	g := m.gens[gi]
	cache := g.caches[inst]
	ks := g.keys[t.key]
	ans, ok := grp.answers[t.key]
	if !ok {
		m.fail("gen %d inst %d: the request of %s left, and its ask was not in group G%d", gi, inst, t.key, grp.id)
		return
	}
	if ans.Err != nil {
		m.fail("gen %d inst %d: the refill of %s, whose request left: %v", gi, inst, t.key, ans.Err)
		return
	}
	after := cache.leases(t.key)
	kept := after[0].gen != before[0].gen && after[0].units > 0
	m.totals.left.Add(1)
	note := ""
	if t.renewal {
		m.totals.leftRenewals.Add(1)
		note = " (a renewal)"
	}
	var what string
	switch {
	case t.resetQueued:
		m.totals.leftResetQueued.Add(1)
		prev := ks.hwm
		ks.hwm = max(ks.hwm, grp.decidedAt)
		if kept {
			m.fail("gen %d inst %d: the refill of %s, whose request left, was sent before the key's reset ended, and the cache kept its lease %d (%d units)", gi, inst, t.key, after[0].gen, after[0].units)
			return
		}
		what = "dropped, the key was reset while it was queued"
		if ans.Allowed {
			// Decided on the fresh state: the units stay taken there.
			a := &modelAdmission{id: m.nextID, gen: gi, inst: inst, key: t.key, cost: ans.Receipt.Granted, d: ans.Admission, epoch: ks.epoch, stranded: true}
			m.nextID++
			a.decidedByStore(ans.Time, grp.decidedAt, prev, g.p.Algorithm)
			m.adm = append(m.adm, a)
			what += fmt.Sprintf("; its %d units stay taken in the store (#%d, at %s)", a.cost, a.id, m.rel(a.spend))
		}
	case t.reset:
		m.totals.leftReset.Add(1)
		if kept {
			m.fail("gen %d inst %d: the refill of %s, whose request left, was decided before the key's reset, and the cache kept its lease %d (%d units)", gi, inst, t.key, after[0].gen, after[0].units)
			return
		}
		what = "dropped, the key was reset meanwhile"
	case cache.closed.Load():
		m.totals.leftClosed.Add(1)
		ks.hwm = max(ks.hwm, grp.decidedAt)
		if after[0].units > 0 || after[1].units > 0 {
			m.fail("gen %d inst %d: the refill of %s, whose request left, answered a closed cache, which holds %d units of the key", gi, inst, t.key, after[0].units+after[1].units)
			return
		}
		what = "given back, the cache closed meanwhile"
	case !ans.Allowed:
		ks.hwm = max(ks.hwm, grp.decidedAt)
		what = "refused"
	case g.p.Algorithm == limiter.SlidingWindowLog && ans.Receipt.Name()-ans.Receipt.At < limiter.LeaseLifetime.Microseconds():
		// The store logged the grant at its time, not a lifetime ahead:
		// spent later, its units would leave the window early.
		ks.hwm = max(ks.hwm, grp.decidedAt)
		if kept {
			m.fail("gen %d inst %d: the refill of %s, whose request left, brought a grant the store did not log ahead, and the cache kept it (lease %d, %d units)", gi, inst, t.key, after[0].gen, after[0].units)
			return
		}
		what = "given back, not logged ahead"
	default:
		prev := ks.hwm
		ks.hwm = max(ks.hwm, grp.decidedAt)
		if !kept || after[0].units != ans.Receipt.Granted {
			m.fail("gen %d inst %d: the store granted the refill of %s, whose request left, %d units; the key's lease is %d units (lease %d, before %d): want the grant whole", gi, inst, t.key, ans.Receipt.Granted, after[0].units, after[0].gen, before[0].gen)
			return
		}
		var x modelAdmission
		x.decidedByStore(ans.Time, grp.decidedAt, prev, g.p.Algorithm)
		lg := modelGrant{inst, t.key, after[0].gen}
		g.grants[lg], g.rawGrants[lg] = x.store, x.raw
		what = fmt.Sprintf("kept whole as lease %d (%d units), granted at %s", after[0].gen, after[0].units, m.rel(x.store))
	}
	m.logf("gen %d inst %d: the answer of %s, whose request left%s, came: %s", gi, inst, t.key, note, what)
}

// TestNearCacheLeftRefillNotLoggedAheadGoesBack: the refill of a request
// that left its lane's queue keeps its lease for the key's next requests
// only if they may spend it later (Cache.spendsAhead), as a refill
// ahead's: a sliding log's grant of the request's cost alone is logged at
// its time, not a lifetime ahead, so spent later it would leave the
// store's window early. It used to be kept: another instance was then
// admitted the whole limit once the grant's entry left the window, and
// the lease paid 2 more within the same window (found by TestModel, a
// burst's leaver on sliding_window_log). Now it goes back when it comes.
func TestNearCacheLeftRefillNotLoggedAheadGoesBack(t *testing.T) {
	ctx := context.Background()
	p := limiter.Policy{Algorithm: limiter.SlidingWindowLog, Events: 4, Window: 500 * time.Millisecond}
	clock := testutil.NewClock(time.Unix(1_800_000_000, 0))
	mem := newTestMemory(t, p, clock)
	cache, store, queued := gatedCache(t, mem, p, clock, 16)

	first := busyLane(ctx, t, cache, &store.replyGate)
	leaving, leave := context.WithCancel(ctx)
	left := takeAsync(leaving, cache, "k", 2)
	queued.wait(t, 1)
	leave()
	if r := <-left; r.err == nil {
		t.Fatalf("the request that left: %+v; want its context's error", r.d)
	}
	close(store.release)
	<-first
	cache.refills.Wait() // the left refill has answered

	if held := cache.held(); held != 0 {
		t.Errorf("the cache holds %d units of a grant its store did not log ahead", held)
	}
	if d, err := mem.Peek(ctx, "k"); err != nil || d.Remaining != 4 {
		t.Errorf("k right after its left refill answered: %+v, %v; want 4 left (nothing admitted)", d, err)
	}
	// Past the grant's entry in the window, within the lease's lifetime:
	// another instance takes the whole limit, and this one must not add
	// to it from the old grant.
	clock.Advance(600 * time.Millisecond)
	if d, err := mem.Take(ctx, "k", 4); err != nil || !d.Allowed {
		t.Fatalf("another instance's take of the limit: %+v, %v", d, err)
	}
	if d, err := cache.Take(ctx, "k", 2); err != nil || d.Allowed {
		t.Errorf("take of 2 right after the limit was admitted: %+v, %v; want refused", d.Decision, err)
	}
}

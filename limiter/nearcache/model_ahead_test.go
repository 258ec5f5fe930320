package nearcache

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Refills ahead in TestModel. A cache hands each refill ahead to the
// model (Options.goAhead) instead of a goroutine, and the model moves it
// on in two phases of its own choosing, so schedules stay deterministic
// and reach every order: sent (the store decides; the answer is held on
// its way back, modelSlowLeaser.TakeUpTo), then delivered (the cache
// hears it). Between the two the schedule may advance past the current
// lease's expiry or the grant's own, reset the key on this instance (the
// reset waits for the answer: nearShard.backs) or on another (the answer
// is spent after it: the reset's allowance counts it), close the
// instance, or send requests that find the lease short and wait for it
// (Options.waiting: the model then moves the refill on, as its answer
// would come).
//
// modelAheadState is where a refill ahead stands.
type modelAheadState int

const (
	aheadQueued  modelAheadState = iota // handed to the model, not sent
	aheadInLane                         // sent, queued behind its lane's call under way
	aheadGrouped                        // in a group the model holds, not sent
	aheadDecided                        // the store decided; the answer is held
	aheadDone                           // the cache heard the answer (or it asked nothing)
)

// modelAhead is one refill ahead of key on instance inst of generation gi.
type modelAhead struct {
	id       int
	gi, inst int
	key      string
	run      func()
	state    modelAheadState
	// decided is closed once the store decided, deliver by the model to
	// let the answer through, finished once run returned.
	decided, deliver, finished chan struct{}
	d                          limiter.Admission
	err                        error
	// decidedAt is the clock when the store decided; prev the key's
	// timeline (modelKeyState.hwm) before it; epoch the key's resets
	// then.
	decidedAt, prev int64
	epoch           int
	// gen is the lease it became, once delivered (0: none).
	gen uint64
	// group is the group it went in, if it queued.
	group *modelGroup
	// deadline is the caches' clock (µs) by which its answer has come: a
	// token bucket's, aheadTimeout after it was sent (modelRun.advance
	// delivers it then); 0 for the others, whose answers may come any
	// time.
	deadline int64
}

// modelWait is a request of key on instance inst of generation gi about to
// wait for a refill under way.
type modelWait struct {
	gi, inst int
	key      string
}

// modelQueued is a lease request that joined its lane's queue
// (Options.queued): it goes on once resume is closed.
type modelQueued struct {
	modelWait
	resume chan struct{}
}

// aheadHooks are the Options hooks of instance inst of generation gi.
func (m *modelRun) aheadHooks(gi, inst int, opts *Options) {
	opts.goAhead = func(key string, run func()) {
		m.aheadSeq++
		a := &modelAhead{id: m.aheadSeq, gi: gi, inst: inst, key: key, run: run}
		m.aheads = append(m.aheads, a)
		m.totals.aheads.Add(1)
		m.logf("gen %d inst %d: refill ahead A%d of %s handed over", gi, inst, a.id, key)
	}
	// A give-back of a lease the next one replaced runs at once, on the
	// request that promoted it.
	opts.goBack = func(run func()) { run() }
	opts.waiting = func(key string) {
		m.waits <- modelWait{gi, inst, key}
		<-m.resume
	}
	opts.queued = func(key string) {
		resume := make(chan struct{})
		m.queues <- modelQueued{modelWait{gi, inst, key}, resume}
		<-resume
	}
	opts.goGroup = func(keys []string, run func()) {
		m.groupSeq++
		g := &modelGroup{id: m.groupSeq, gi: gi, inst: inst, keys: keys, run: run}
		var requests []string
		for _, key := range keys {
			if a := m.laneAhead(gi, inst, key); a != nil {
				a.state, a.group = aheadGrouped, g
				g.aheads = append(g.aheads, a)
			} else {
				requests = append(requests, key)
			}
		}
		m.groups = append(m.groups, g)
		m.totals.groups.Add(1)
		if len(keys) > 1 {
			m.totals.groupsShared.Add(1)
		}
		m.logf("gen %d inst %d: group G%d of %v handed over (requests: %v)", gi, inst, g.id, keys, requests)
	}
	if opts.LeaseFraction > 0 {
		// A refused instance's request for the others' leases of a key
		// is delivered at a step of the schedule's choosing (reclaim).
		opts.Reclaim = func(name string) {
			m.reclaims = append(m.reclaims, modelReclaim{gi, inst, name})
			m.logf("gen %d inst %d asks the others for the leases of %s", gi, inst, name)
		}
		opts.Name = func(key string) string { return "name:" + key }
	}
}

// modelReclaim is a request of instance inst of generation gi for the
// other instances' leases of the key named name.
type modelReclaim struct {
	gi, inst int
	name     string
}

// reclaim delivers a random request for leases still undelivered to every
// other instance of its generation, which returns what it holds of the
// key (Cache.ReturnNamed), as its subscription would.
func (m *modelRun) reclaim() {
	if len(m.reclaims) == 0 {
		return
	}
	i := m.rng.IntN(len(m.reclaims))
	rc := m.reclaims[i]
	m.reclaims = slices.Delete(m.reclaims, i, i+1)
	g := m.gens[rc.gi]
	for j, cache := range g.caches {
		if j == rc.inst {
			continue
		}
		held := cache.held()
		if err := cache.ReturnNamed(m.ctx, rc.name); err != nil {
			m.fail("gen %d inst %d: returning the leases of %s: %v", rc.gi, j, rc.name, err)
			return
		}
		if now := cache.held(); now != held {
			m.totals.reclaimed.Add(1)
			m.logf("gen %d inst %d returns the leases of %s to inst %d: held %d, now %d", rc.gi, j, rc.name, rc.inst, held, now)
		}
	}
	m.drainReturns(g)
}

// callWaiting runs f, a call of a cache that may wait for a refill ahead
// under way, and moves every refill it waits for on until it answers.
// While f runs the model does nothing else, so f may change the model's
// state (a slow reply's hook does).
func (m *modelRun) callWaiting(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	for {
		select {
		case <-done:
			return
		case w := <-m.waits:
			// Every refill ahead of the key under way there: one of a key
			// a reset forgot may still be queued beside the one waited for.
			as := m.pendingAheads(w.gi, w.inst, w.key)
			if len(as) == 0 {
				m.fail("gen %d inst %d: a request of %s waits for a refill, and no refill ahead of it is under way", w.gi, w.inst, w.key)
			}
			for _, a := range as {
				m.logf("gen %d inst %d: a request of %s waits for A%d", w.gi, w.inst, w.key, a.id)
				m.completeAhead(a)
			}
			m.totals.waited.Add(1)
			m.resume <- struct{}{}
		case q := <-m.queues:
			// A request queued behind its lane's call under way: the lane
			// moves on until the group it went in has answered.
			m.logf("gen %d inst %d: a request of %s queues", q.gi, q.inst, q.key)
			m.driveQueued(q.modelWait)
			m.totals.queuedRequests.Add(1)
			close(q.resume)
		}
	}
}

// pendingAheads are the refills ahead under way of key on instance inst
// of generation gi, oldest first.
func (m *modelRun) pendingAheads(gi, inst int, key string) []*modelAhead {
	var as []*modelAhead
	for _, a := range m.aheads {
		if a.gi == gi && a.inst == inst && a.key == key {
			as = append(as, a)
		}
	}
	return as
}

// stepAhead moves a random refill ahead under way on by one phase.
func (m *modelRun) stepAhead() {
	if len(m.aheads) == 0 {
		return
	}
	a := m.aheads[m.rng.IntN(len(m.aheads))]
	switch {
	case a.state == aheadQueued && m.rng.IntN(3) == 0:
		m.completeAhead(a) // sent and answered at once
	case a.state == aheadQueued:
		m.sendAhead(a)
	case a.state == aheadInLane:
		if !m.moveLane(a.gi, a.inst) {
			m.fail("gen %d inst %d: A%d of %s queued, and no call of its lane is under way", a.gi, a.inst, a.id, a.key)
		}
	case a.state == aheadGrouped:
		m.sendGroup(a.group)
	default:
		m.deliverAhead(a)
	}
}

// nextDeadline is the earliest deadline of a refill ahead whose store
// decided (see modelAhead.deadline), and that refill; nil if none.
func (m *modelRun) nextDeadline() (int64, *modelAhead) {
	var first *modelAhead
	for _, a := range m.aheads {
		if a.state == aheadDecided && a.deadline > 0 && (first == nil || a.deadline < first.deadline) {
			first = a
		}
	}
	if first == nil {
		return 0, nil
	}
	return first.deadline, first
}

// completeAhead moves a on until its answer reached the cache: in a
// group, with the others of its group.
func (m *modelRun) completeAhead(a *modelAhead) {
	for a.state != aheadDone && m.failure == "" {
		switch a.state {
		case aheadQueued:
			m.sendAhead(a)
		case aheadInLane:
			if !m.moveLane(a.gi, a.inst) {
				m.fail("gen %d inst %d: A%d of %s queued, and no call of its lane is under way", a.gi, a.inst, a.id, a.key)
			}
		case aheadGrouped:
			m.sendGroup(a.group)
		case aheadDecided:
			m.deliverAhead(a)
		}
	}
}

// completeAheads completes every refill ahead under way of generation gi
// (-1: all) on instance inst (-1: all) that is at least in state from.
func (m *modelRun) completeAheads(gi, inst int, from modelAheadState) {
	for _, a := range slices.Clone(m.aheads) {
		if (gi < 0 || a.gi == gi) && (inst < 0 || a.inst == inst) && a.state >= from {
			m.completeAhead(a)
		}
	}
}

// sendAhead lets a's request reach the store, which decides it; its answer
// is held until deliverAhead. A refill of a key a reset forgot asks
// nothing and is done.
func (m *modelRun) sendAhead(a *modelAhead) {
	g := m.gens[a.gi]
	st := g.stores[a.inst]
	ks := g.keys[a.key]
	a.decided, a.deliver, a.finished = make(chan struct{}), make(chan struct{}), make(chan struct{})
	a.prev, a.epoch = ks.hwm, ks.epoch
	if g.caches[a.inst].returnsCredit {
		a.deadline = m.cacheNow() + aheadTimeout.Microseconds()
	}
	st.ahead = a
	go func() {
		defer close(a.finished)
		a.run()
	}()
	select {
	case <-a.decided:
		a.state = aheadDecided
		m.observe()
		ks.hwm = max(ks.hwm, a.decidedAt)
		if a.err != nil {
			m.fail("gen %d inst %d: refill ahead A%d of %s: %v", a.gi, a.inst, a.id, a.key, a.err)
			return
		}
		m.logf("gen %d inst %d: A%d sent, the store decided: allowed %v, granted %d", a.gi, a.inst, a.id, a.d.Allowed, a.d.Receipt.Granted)
	case <-a.finished:
		st.ahead = nil
		a.state = aheadDone
		m.aheads = slices.DeleteFunc(m.aheads, func(x *modelAhead) bool { return x == a })
		m.totals.aheadsForgotten.Add(1)
		m.logf("gen %d inst %d: A%d asked nothing: its key was reset", a.gi, a.inst, a.id)
	case q := <-m.queues:
		// Queued behind its lane's call under way: it goes in a group.
		st.ahead = nil
		if q.modelWait != (modelWait{a.gi, a.inst, a.key}) {
			m.fail("gen %d inst %d: A%d of %s sent, and a request of %s on gen %d inst %d queued", a.gi, a.inst, a.id, a.key, q.key, q.gi, q.inst)
		}
		a.state = aheadInLane
		m.totals.aheadsQueued.Add(1)
		m.logf("gen %d inst %d: A%d sent, queued behind its lane's call", a.gi, a.inst, a.id)
		close(q.resume)
	}
}

// deliverAhead lets a's answer reach the cache, and notes the lease it
// became, if any: its grant counts where the store decided it, as a
// take's (modelAdmission.decidedByStore).
func (m *modelRun) deliverAhead(a *modelAhead) {
	if a.group != nil {
		m.completeGroup(a.group)
		return
	}
	g := m.gens[a.gi]
	cache := g.caches[a.inst]
	before := cache.leases(a.key)
	close(a.deliver)
	<-a.finished
	m.drainReturns(g)
	m.aheadAnswered(a, before)
}

// aheadAnswered notes that a's answer reached the cache, whose leases of
// a's key were before before it did.
func (m *modelRun) aheadAnswered(a *modelAhead, before [2]modelLease) {
	g := m.gens[a.gi]
	cache := g.caches[a.inst]
	expired := m.cacheNow() >= before[0].expires
	a.state = aheadDone
	m.aheads = slices.DeleteFunc(m.aheads, func(x *modelAhead) bool { return x == a })
	after := cache.leases(a.key)
	what := "not kept"
	if after[1].gen != before[1].gen && after[1].units > 0 {
		a.gen = after[1].gen
		var x modelAdmission
		x.decidedByStore(a.d.Time, a.decidedAt, a.prev, g.p.Algorithm)
		lg := modelGrant{a.inst, a.key, a.gen}
		g.grants[lg], g.rawGrants[lg] = x.store, x.raw
		g.aheadGens[lg] = true
		what = "kept as the next lease"
		if expired {
			m.totals.aheadsLate.Add(1)
			what += ", the current one expired meanwhile"
		}
		if a.epoch < g.keys[a.key].epoch {
			m.totals.aheadsReset.Add(1)
			what += ", decided before a reset on another instance"
		}
	}
	if cache.closed.Load() {
		m.totals.aheadsClosed.Add(1)
		what += " (the cache is closed)"
	}
	if a.group != nil {
		what += fmt.Sprintf(" (in group G%d)", a.group.id)
		m.totals.aheadsGrouped.Add(1)
		if expired || a.epoch < g.keys[a.key].epoch || cache.closed.Load() {
			m.totals.aheadsGroupedLate.Add(1)
		}
	}
	m.logf("gen %d inst %d: A%d answered: %s (lease %d, %d units)", a.gi, a.inst, a.id, what, after[1].gen, after[1].units)
}

// closeInstance closes instance inst of generation gi mid-schedule, as a
// reload that drops its handler does: its leases go back, then the
// refills ahead under way answer (and give back what they bring), then
// Close returns. Afterwards it decides by the store alone.
func (m *modelRun) closeInstance(gi, inst int) {
	if m.beginClose(gi, inst) {
		m.endClose(gi, inst)
	}
}

// beginClose is Close up to its wait, reporting whether the instance was
// open: leases given back, refills ahead answered. A burst whose group
// is still with the store answers it (and resumes its requests) between
// beginClose and endClose, since Close waits for requests' refills too.
func (m *modelRun) beginClose(gi, inst int) bool {
	g := m.gens[gi]
	if g.caches == nil || g.caches[inst].closed.Load() {
		return false
	}
	cache := g.caches[inst]
	held := cache.held()
	cache.closeLeases()
	cache.givingBack.Wait()
	m.drainReturns(g)
	m.logf("gen %d inst %d closed: gave back %d units; %d refills ahead under way", gi, inst, held, len(m.aheadsOf(gi, inst)))
	m.completeAheads(gi, inst, aheadQueued)
	return true
}

// endClose is the rest of Close: it waits for what is under way.
func (m *modelRun) endClose(gi, inst int) {
	g := m.gens[gi]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.caches[inst].waitClosed(ctx); err != nil {
		m.fail("gen %d inst %d: close: %v", gi, inst, err)
	}
	// Close returns once every unit leased is back in the store, those
	// of refills that answered after it began included.
	if h := g.caches[inst].held(); h != 0 {
		m.fail("gen %d inst %d: Close returned, and the cache still holds %d units in leases", gi, inst, h)
	}
	m.drainReturns(g)
}

// aheadsOf lists the refills ahead under way on instance inst of gi.
func (m *modelRun) aheadsOf(gi, inst int) []*modelAhead {
	var as []*modelAhead
	for _, a := range m.aheads {
		if a.gi == gi && a.inst == inst {
			as = append(as, a)
		}
	}
	return as
}

// drainReturns notes the keys whose units the stores of g took back
// (ReturnMany: the janitor, Close, a retired lease, a refill ahead given
// back): the store decided for them now (modelKeyState.hwm).
func (m *modelRun) drainReturns(g *modelGen) {
	for _, st := range g.stores {
		st.mu.Lock()
		keys := st.returned
		st.returned = nil
		st.mu.Unlock()
		for _, key := range keys {
			m.touch(g, key)
		}
	}
}

// modelLease is one lease a cache holds for a key.
type modelLease struct {
	units, expires int64
	gen            uint64
}

// leases is c's current lease of key and its next one (refilled ahead).
func (c *Cache) leases(key string) [2]modelLease {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var ls [2]modelLease
	if k := sh.keys[key]; k != nil {
		ls[0] = modelLease{k.units, k.expires, k.gen}
		ls[1] = modelLease{k.next.units, k.next.expires, k.next.gen}
	}
	return ls
}

// TakeUpTo holds the answer of the refill ahead the model is sending
// (ahead) once the store decided it, until the model delivers it; any
// other lease is a request's, answered as Take is (replyHook).
func (s *modelSlowLeaser) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	if g := s.group; g != nil {
		// A group of one goes by itself.
		s.group = nil
		d, err := s.Leaser.TakeUpTo(ctx, key, cost, want)
		answers := []limiter.LeaseAnswer{{Admission: d, Err: err}}
		s.holdGroup(g, []limiter.LeaseAsk{{Key: key}}, answers)
		return answers[0].Admission, answers[0].Err
	}
	if a := s.ahead; a != nil && a.key == key {
		s.ahead = nil
		a.d, a.err = s.Leaser.TakeUpTo(ctx, key, cost, want)
		a.decidedAt = s.m.clock.Now().UnixMicro()
		close(a.decided)
		<-a.deliver
		return a.d, a.err
	}
	var d limiter.Admission
	var err error
	if s.holdLone(key, false, func() { d, err = s.Leaser.TakeUpTo(ctx, key, cost, want) }) {
		return d, err
	}
	return s.replyHook.TakeUpTo(ctx, key, cost, want)
}

// ReturnMany notes the keys it returns units of (drainReturns).
func (s *modelSlowLeaser) ReturnMany(ctx context.Context, returns []limiter.Return) error {
	err := s.Leaser.ReturnMany(ctx, returns)
	s.mu.Lock()
	for _, r := range returns {
		s.returned = append(s.returned, r.Key)
	}
	s.mu.Unlock()
	return err
}

// decidedAhead is a refill ahead of generation gi whose store decided
// and whose answer has not come, or nil.
func (m *modelRun) decidedAhead(gi int) *modelAhead {
	for _, a := range m.aheads {
		if a.gi == gi && a.state == aheadDecided {
			return a
		}
	}
	return nil
}

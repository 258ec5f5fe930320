package nearcache

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Groups (lanes.go). A lease request sent while another of its instance
// is under way (a refill ahead sent and not yet delivered, or a group)
// joins the lane's queue (Options.queued): a refill ahead is then "in
// lane"; a request, which the model sends synchronously, makes the model
// move the lane on until its group has answered. The cache hands each
// group to the model (Options.goGroup), which sends it (the store decides
// every ask in one call; the answers are held, modelSlowLeaser.LeaseMany)
// and delivers it at steps of its choosing, as for a refill ahead alone:
// a group of refills ahead may answer after expiries, resets elsewhere
// and a close.

// modelGroup is a group call of instance inst of generation gi: the asks
// of keys, refills ahead (aheads) and requests (the other keys), sent in
// one call of the store when the model runs run.
type modelGroup struct {
	id       int
	gi, inst int
	keys     []string
	run      func()
	aheads   []*modelAhead
	// sent is set once the store decided, at decidedAt; decided is closed
	// then, deliver by the model to let the answers through, finished
	// once run returned.
	sent                       bool
	decidedAt                  int64
	decided, deliver, finished chan struct{}
	// answers are the store's answers to the asks, by key, once it
	// decided; backs the keys whose ask carried a give-back (a renewal),
	// which holds its shard's backs lock until its answer is taken.
	answers map[string]limiter.LeaseAnswer
	backs   []string
}

// driveQueued moves the lane of the request q on until the group it is
// in has answered.
func (m *modelRun) driveQueued(q modelWait) {
	for m.failure == "" {
		if g := m.groupOf(q); g != nil {
			m.completeGroup(g)
			return
		}
		if !m.moveLane(q.gi, q.inst) {
			m.fail("gen %d inst %d: a request of %s queued, and no call of its lane is under way", q.gi, q.inst, q.key)
		}
	}
}

// groupOf is the group held for the request q (its key, not as a refill
// ahead), or nil.
func (m *modelRun) groupOf(q modelWait) *modelGroup {
	for _, g := range m.groups {
		if g.gi != q.gi || g.inst != q.inst || !slices.Contains(g.keys, q.key) {
			continue
		}
		if !slices.ContainsFunc(g.aheads, func(a *modelAhead) bool { return a.key == q.key }) {
			return g
		}
	}
	return nil
}

// laneAhead is the refill ahead of key on instance inst of generation gi
// queued in its lane, or nil.
func (m *modelRun) laneAhead(gi, inst int, key string) *modelAhead {
	for _, a := range m.aheads {
		if a.gi == gi && a.inst == inst && a.key == key && a.state == aheadInLane {
			return a
		}
	}
	return nil
}

// moveLane answers the call under way on the lane of instance inst of
// generation gi (one lane: the model's stores have one server), which
// hands the lane's queue on as a group, and reports whether there was
// one: a group, or a refill ahead sent alone.
func (m *modelRun) moveLane(gi, inst int) bool {
	for _, g := range m.groups {
		if g.gi == gi && g.inst == inst {
			m.completeGroup(g)
			return true
		}
	}
	for _, a := range m.aheads {
		if a.gi == gi && a.inst == inst && a.state == aheadDecided && a.group == nil {
			m.deliverAhead(a)
			return true
		}
	}
	return false
}

// completeGroup sends g, if the model has not, and delivers its answers.
func (m *modelRun) completeGroup(g *modelGroup) {
	if !g.sent {
		m.sendGroup(g)
	}
	if m.failure == "" {
		m.deliverGroup(g)
	}
}

// sendGroup lets g's call reach the store, which decides every ask in it;
// the answers are held until deliverGroup.
func (m *modelRun) sendGroup(g *modelGroup) {
	gen := m.gens[g.gi]
	st := gen.stores[g.inst]
	for _, a := range g.aheads {
		ks := gen.keys[a.key]
		a.prev, a.epoch = ks.hwm, ks.epoch
		if gen.caches[a.inst].returnsCredit {
			a.deadline = m.cacheNow() + aheadTimeout.Microseconds()
		}
	}
	g.decided, g.deliver, g.finished = make(chan struct{}), make(chan struct{}), make(chan struct{})
	st.group = g
	go func() {
		defer close(g.finished)
		g.run()
	}()
	<-g.decided
	g.sent = true
	m.observe()
	for _, a := range g.aheads {
		a.state = aheadDecided
		ks := gen.keys[a.key]
		ks.hwm = max(ks.hwm, a.decidedAt)
		if a.err != nil {
			m.fail("gen %d inst %d: refill ahead A%d of %s in group G%d: %v", a.gi, a.inst, a.id, a.key, g.id, a.err)
		}
	}
	m.logf("gen %d inst %d: G%d sent, the store decided %d asks", g.gi, g.inst, g.id, len(g.keys))
}

// deliverGroup lets g's answers reach the cache: each refill ahead in it
// as deliverAhead does for one alone, each request to its requester
// (which the model resumes once the group has answered).
func (m *modelRun) deliverGroup(g *modelGroup) {
	gen := m.gens[g.gi]
	cache := gen.caches[g.inst]
	befores := make([][2]modelLease, len(g.aheads))
	for i, a := range g.aheads {
		befores[i] = cache.leases(a.key)
	}
	close(g.deliver)
	<-g.finished
	for _, a := range g.aheads {
		<-a.finished
	}
	m.groups = slices.DeleteFunc(m.groups, func(x *modelGroup) bool { return x == g })
	m.drainReturns(gen)
	m.logf("gen %d inst %d: G%d answered", g.gi, g.inst, g.id)
	for i, a := range g.aheads {
		m.aheadAnswered(a, befores[i])
	}
}

// Renew holds the answer of a group of one, a renewal, that the model is
// sending, as LeaseMany does; any other is a request's (replyHook).
func (s *modelSlowLeaser) Renew(ctx context.Context, back limiter.Return, cost, want int64) (limiter.Admission, error) {
	if g := s.group; g != nil {
		s.group = nil
		d, err := s.Leaser.Renew(ctx, back, cost, want)
		answers := []limiter.LeaseAnswer{{Admission: d, Err: err}}
		s.holdGroup(g, []limiter.LeaseAsk{{Key: back.Key, Back: back}}, answers)
		return answers[0].Admission, answers[0].Err
	}
	var d limiter.Admission
	var err error
	if s.holdLone(back.Key, true, func() { d, err = s.Leaser.Renew(ctx, back, cost, want) }) {
		return d, err
	}
	return s.replyHook.Renew(ctx, back, cost, want)
}

// LeaseLane makes the slow leaser a LeaseBatcher when the store it stands
// for is one: its lane.
func (s *modelSlowLeaser) LeaseLane(key string) int {
	return s.Leaser.(limiter.LeaseBatcher).LeaseLane(key)
}

// LeaseMany decides a group the model is sending (group) in one call of
// the store and holds the answers until the model delivers them.
func (s *modelSlowLeaser) LeaseMany(ctx context.Context, asks []limiter.LeaseAsk) []limiter.LeaseAnswer {
	g := s.group
	s.group = nil
	answers := s.Leaser.(limiter.LeaseBatcher).LeaseMany(ctx, asks)
	if g == nil {
		s.m.fail("a group of %d asks the model did not send", len(asks))
		return answers
	}
	s.holdGroup(g, asks, answers)
	return answers
}

// holdGroup notes the store's answers to g's asks, the refills ahead's
// in their modelAhead, and the time the store decided, which a request
// in the group counts at (modelSlowLeaser.decided); then it holds them
// until the model delivers g.
func (s *modelSlowLeaser) holdGroup(g *modelGroup, asks []limiter.LeaseAsk, answers []limiter.LeaseAnswer) {
	now := s.m.clock.Now().UnixMicro()
	g.decidedAt, s.decided = now, now
	g.answers = map[string]limiter.LeaseAnswer{}
	for i, ask := range asks {
		g.answers[ask.Key] = answers[i]
		if ask.Back.Units > 0 {
			g.backs = append(g.backs, ask.Key)
		}
		for _, a := range g.aheads {
			if a.key == ask.Key {
				a.d, a.err, a.decidedAt = answers[i].Admission, answers[i].Err, now
			}
		}
	}
	close(g.decided)
	<-g.deliver
}

// modelHold holds the next lone lease call of a store (TakeUpTo, Renew)
// once the store decided it, until the model lets it through: a request's
// call under way while others queue behind it (burst). key is the key it
// held, at, when the store decided.
type modelHold struct {
	key              string
	at               int64
	decided, deliver chan struct{}
	// renew is set when the call is a renewal, which holds its shard's
	// backs lock until its answer is taken.
	renew bool
}

// holdLone holds a lone call of key, which call makes, if the model
// armed a hold; it reports whether it did.
func (s *modelSlowLeaser) holdLone(key string, renew bool, call func()) bool {
	h := s.hold
	if h == nil {
		return false
	}
	s.hold = nil
	call()
	h.key, h.at, h.renew = key, s.m.clock.Now().UnixMicro(), renew
	close(h.decided)
	<-h.deliver
	return true
}

// modelBurstTake is one request of a burst: cost units of key, sent when
// the key had had epoch resets; res is its answer once it came, decided
// when the store decided it (0: it did not).
type modelBurstTake struct {
	key   string
	cost  int64
	epoch int
	res   *takeResult
	// answered is the clock (µs) when res came.
	answered, decided int64
	// resume lets it go on once it queued (modelQueued).
	resume chan struct{}
	// cancel ends its context, so that, queued, it leaves; left is set
	// once it did, renewal when its ask carried a give-back, reset when
	// its key was reset on its instance before the answer came.
	cancel               context.CancelFunc
	left, renewal, reset bool
	// resetQueued is set when its key was reset on its instance while
	// its ask was still in the lane's queue: the store decided it after
	// the reset.
	resetQueued bool
}

// burst sends a request of every key on instance inst of generation gi
// at once, as concurrent clients do, each once the one before has gone as
// far as it can: answered from memory, or its lease request under way
// (the first; its answer held) or queued behind it. The first's answer
// comes, and the queued ones go in one group; meanwhile the clock may
// move on, so leases expire while requests wait, and between the group's
// send and its answer the instance may close. Then each request that
// queued takes its answer, one at a time, and the model notes every
// answer as a take's.
//
// Some requests that queued may leave first (their contexts end), as
// clients that give up do: before the call ahead of them returns, or
// once the store decided their group. Their Take returns the context's
// error and the model books no admission for them; what their refill
// brings becomes the key's lease, whole, for later requests (or goes
// back, the cache closed meanwhile), and the model notes its grant as a
// refill ahead's (leftAnswered). With no give-back in the group (none
// holds its shard's backs lock), the key of one that left may be reset
// on its instance before the answer comes: the answer is then dropped.
//
// The instance's refills ahead handed over and not sent may queue behind
// the first request's call instead of the requests after it: their group
// is then left under way, for later steps to send and answer (stepAhead),
// after expiries, resets elsewhere or a close. Their keys send no request
// (it would wait for the refill). Only on an open cache with leases whose
// lane is idle: no refill ahead of the instance sent, nor a group under
// way, so every call of its lane is the burst's.
func (m *modelRun) burst(gi, inst int) {
	g := m.gens[gi]
	if g.caches == nil || m.c.fraction == 0 {
		return
	}
	if m.rng.IntN(2) == 0 {
		// Rather an instance with refills ahead to send behind a request.
		for _, a := range m.aheads {
			if a.gi == gi && a.state == aheadQueued {
				inst = a.inst
			}
		}
	}
	cache, st := g.caches[inst], g.stores[inst]
	if cache.closed.Load() {
		return
	}
	for _, grp := range m.groups {
		if grp.gi == gi && grp.inst == inst {
			return
		}
	}
	aheads := m.aheadsOf(gi, inst)
	var keys []string
	for _, k := range m.rng.Perm(len(m.keys)) {
		key := m.keys[k]
		if !slices.ContainsFunc(aheads, func(a *modelAhead) bool { return a.key == key }) {
			keys = append(keys, key)
		}
	}
	for _, a := range aheads {
		if a.state != aheadQueued {
			return
		}
	}
	aheadsBehind := len(aheads) > 0 && m.rng.IntN(2) == 0
	hold := &modelHold{decided: make(chan struct{}), deliver: make(chan struct{})}
	st.hold = hold
	released := false
	var takes []*modelBurstTake
	defer func() {
		// After a failure, nothing waits for the model any more.
		st.hold = nil
		if !released {
			close(hold.deliver)
		}
		for _, t := range takes {
			if t.resume != nil {
				close(t.resume)
			}
			t.cancel()
		}
	}()
	results := make(chan struct {
		i   int
		res takeResult
	}, len(keys))
	held := -1
	for i, key := range keys {
		if held >= 0 && aheadsBehind {
			break
		}
		ctx, cancel := context.WithCancel(m.ctx)
		t := &modelBurstTake{key: key, cost: 1 + m.rng.Int64N(min(3, g.quota)), epoch: g.keys[key].epoch, cancel: cancel}
		takes = append(takes, t)
		go func() {
			d, err := cache.Take(ctx, t.key, t.cost)
			results <- struct {
				i   int
				res takeResult
			}{i, takeResult{d, err}}
		}()
		decided := hold.decided
		if held >= 0 {
			decided = nil // the hold has its call
		}
		select {
		case r := <-results:
			t.res, t.answered = &r.res, m.clock.Now().UnixMicro()
		case <-decided:
			held = i
		case q := <-m.queues:
			if q.modelWait != (modelWait{gi, inst, t.key}) {
				m.fail("gen %d inst %d: a burst's request of %s, and a request of %s on gen %d inst %d queued", gi, inst, t.key, q.key, q.gi, q.inst)
			}
			t.resume = q.resume // it waits in the queued hook until then
		case w := <-m.waits:
			m.fail("gen %d inst %d: a burst's request of %s waits for a refill of %s, and none is under way", gi, inst, t.key, w.key)
		}
		if m.failure != "" {
			return
		}
	}
	st.hold = nil
	var queued []string
	for _, t := range takes {
		if t.resume != nil {
			queued = append(queued, t.key)
		}
	}
	behind := "none"
	if held >= 0 {
		behind = takes[held].key
	}
	m.logf("gen %d inst %d: a burst of %d requests: %d answered at once, %v queued behind the call of %s", gi, inst, len(takes),
		len(takes)-len(queued)-min(1, held+1), queued, behind)
	if held < 0 {
		if len(queued) > 0 {
			m.fail("gen %d inst %d: requests %v queued, and no call of their lane is under way", gi, inst, queued)
		}
		m.bookBurst(gi, inst, takes)
		return
	}
	if aheadsBehind {
		for _, a := range aheads {
			m.sendAhead(a) // it queues behind the held call
			// A refill ahead whose key was reset since it was handed over
			// asks nothing (aheadDone); any other one must queue.
			if a.state != aheadInLane && a.state != aheadDone && m.failure == "" {
				m.fail("gen %d inst %d: A%d of %s sent behind a request's call, and not queued", gi, inst, a.id, a.key)
			}
		}
	}
	if len(queued) > 0 && m.rng.IntN(2) == 0 {
		m.advance(time.Duration(1+m.rng.Int64N(g.w/3)) * time.Microsecond) // the queue waits
	}
	var leavers []*modelBurstTake
	early := false
	if len(queued) > 0 && !modelSkips("leave") && m.rng.IntN(3) == 0 {
		var waiting []*modelBurstTake
		for _, t := range takes {
			if t.resume != nil {
				waiting = append(waiting, t)
			}
		}
		for _, t := range waiting {
			if m.rng.IntN(2) == 0 {
				leavers = append(leavers, t)
			}
		}
		if len(leavers) == 0 {
			leavers = append(leavers, waiting[m.rng.IntN(len(waiting))])
		}
		early = m.rng.IntN(2) == 0
	}
	// leave ends the leavers' contexts while their asks wait (their
	// answers not come): each Take returns at once, with the error.
	leave := func(when string) {
		var keys []string
		for _, t := range leavers {
			t.cancel()
			close(t.resume)
			t.resume = nil
			r := <-results
			takes[r.i].res, takes[r.i].answered = &r.res, m.clock.Now().UnixMicro()
			if takes[r.i] != t {
				m.fail("gen %d inst %d: the request of %s left, and the request of %s answered", gi, inst, t.key, takes[r.i].key)
				return
			}
			if !errors.Is(r.res.err, context.Canceled) {
				m.fail("gen %d inst %d: the request of %s left its lane's queue, and its take returned %+v, %v; want its context's error", gi, inst, t.key, r.res.d.Decision, r.res.err)
				return
			}
			t.left = true
			keys = append(keys, t.key)
		}
		m.logf("gen %d inst %d: the requests of %v leave the queue, %s", gi, inst, keys, when)
	}
	closing := false
	if early {
		leave("before the call ahead of them returns")
		if m.failure != "" {
			return
		}
		if !hold.renew && cache.queuedBacks() == 0 && !modelSkips("reset") && m.rng.IntN(4) == 0 {
			// No give-back under way on the lane holds a backs lock the
			// reset would wait for: it runs while the ask is queued, and
			// the store decides the ask after it.
			t := leavers[m.rng.IntN(len(leavers))]
			m.reset(gi, inst, t.key)
			t.resetQueued = true
		}
		if len(m.aheadsOf(gi, inst)) == 0 && !modelSkips("close") && m.rng.IntN(12) == 0 {
			// No refill ahead for Close to move on while the lane's call
			// is held: the cache closes with the asks queued.
			closing = m.beginClose(gi, inst)
		}
	}
	takes[held].decided = hold.at
	close(hold.deliver)
	released = true
	r := <-results
	takes[r.i].res, takes[r.i].answered = &r.res, m.clock.Now().UnixMicro()
	m.totals.queuedRequests.Add(int64(len(queued)))
	if len(queued) > 0 {
		var grp *modelGroup
		for _, x := range m.groups {
			if x.gi == gi && x.inst == inst {
				grp = x
			}
		}
		if grp == nil {
			m.fail("gen %d inst %d: requests %v queued, and no group was handed over when the call before them returned", gi, inst, queued)
			return
		}
		m.sendGroup(grp)
		if len(leavers) > 0 && !early {
			leave("once the store decided their group")
		}
		if m.failure != "" {
			return
		}
		for _, t := range leavers {
			t.renewal = slices.Contains(grp.backs, t.key)
		}
		if m.rng.IntN(3) == 0 {
			m.advance(time.Duration(1+m.rng.Int64N(g.w/3)) * time.Microsecond) // a slow reply
		}
		resetQueued := slices.ContainsFunc(leavers, func(t *modelBurstTake) bool { return t.resetQueued })
		if len(leavers) > 0 && !resetQueued && len(grp.backs) == 0 && !modelSkips("reset") && m.rng.IntN(4) == 0 {
			// No give-back in the group holds a backs lock the reset would
			// wait for (nearShard.backs): it runs before the answer comes.
			t := leavers[m.rng.IntN(len(leavers))]
			m.reset(gi, inst, t.key)
			t.reset = true
		}
		befores := make([][2]modelLease, len(leavers))
		for i, t := range leavers {
			befores[i] = cache.leases(t.key)
		}
		chance := 20
		if len(leavers) > 0 {
			chance = 8
		}
		if !closing {
			closing = m.rng.IntN(chance) == 0 && !modelSkips("close") && m.beginClose(gi, inst) // the group answers a closed cache
		}
		if slices.Contains(m.groups, grp) {
			m.deliverGroup(grp)
		}
		for i, t := range leavers {
			m.leftAnswered(gi, inst, grp, t, befores[i])
		}
		for _, t := range takes {
			if t.resume == nil || m.failure != "" {
				continue
			}
			t.decided = grp.decidedAt
			close(t.resume)
			t.resume = nil
			r := <-results
			takes[r.i].res, takes[r.i].answered = &r.res, m.clock.Now().UnixMicro()
		}
		if closing {
			m.endClose(gi, inst)
		}
	}
	m.bookBurst(gi, inst, takes)
}

// bookBurst notes the answers of a burst's requests, in the order they
// were sent.
func (m *modelRun) bookBurst(gi, inst int, takes []*modelBurstTake) {
	m.drainReturns(m.gens[gi])
	for _, t := range takes {
		if m.failure != "" {
			return
		}
		if t.left {
			continue // no admission: the requester left
		}
		if t.res == nil {
			m.fail("gen %d inst %d: a burst's request of %s never answered", gi, inst, t.key)
			return
		}
		m.book(gi, inst, t.key, t.cost, t.res.d, t.res.err, t.answered, t.decided, t.epoch, false, " (in a burst)")
	}
}

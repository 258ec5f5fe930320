package ratelimit

import (
	"context"
	"errors"
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// decide has the stores decide req's records in name order, stopping at
// the first that refuses the request or fails closed; a record over the
// limit of an `exceeded pass` zone is passed on and does not stop them.
// It is the only place the request path asks a store. The records of
// remote stores are asked all at once when there are two or more, so a
// request waits for one round trip rather than one per zone; what those
// after a refusal took is then given back, so the outcome is the same as
// deciding them in turn.
func (h *Handler) decide(r *http.Request, req *request) {
	ctx := r.Context()
	req.askAhead(ctx)
	for i := range req.records {
		rec := &req.records[i]
		h.count(rec)
		if rec.phase == undecided {
			req.decidesNothing(rec)
			continue
		}
		if h.decideRecord(r, req, rec) {
			if rec.phase == refused {
				req.refusal = i
			}
			req.withdrawAfter(i + 1)
			return
		}
		if rec.phase == passedOn && req.passing < 0 {
			req.passing = i
		}
	}
}

// count counts, in rec's turn, what its resolution found (see
// resolveNotes).
func (h *Handler) count(rec *zoneRecord) {
	n, z := &rec.noted, rec.zone
	if n.override != 0 {
		z.metrics.override(n.override)
		if n.overrideErr != nil {
			z.logOverrideFailure(h.logger, n.overrideErr)
		}
	}
	switch {
	case n.exempt:
		z.metrics.count(resultAllowed, limiter.SourceStore)
	case n.badCost:
		z.metrics.count(resultDryRunDenied, limiter.SourceStore)
	}
}

// askAhead asks the stores of req's remote records at once, when there
// are two or more: each on a goroutine of its own but the last, which is
// asked on this one.
func (req *request) askAhead(ctx context.Context) {
	n := 0
	for i := range req.records {
		if req.records[i].asksRemote() {
			n++
		}
	}
	if n < 2 {
		return // one is asked in its turn, as fast
	}
	var (
		wg   sync.WaitGroup
		last *zoneRecord
	)
	for i := range req.records {
		rec := &req.records[i]
		if !rec.asksRemote() {
			continue
		}
		rec.phase = askedAhead
		if last != nil {
			wg.Add(1)
			go func(rec *zoneRecord) {
				defer wg.Done()
				rec.take(ctx)
			}(last)
		}
		last = rec
	}
	last.take(ctx)
	wg.Wait()
}

// asksRemote reports whether rec is to be decided by a remote store.
func (rec *zoneRecord) asksRemote() bool { return rec.phase == pending && rec.limit.remote }

// withdrawAfter gives back what the records from index from on took when
// asked ahead: the request stopped before their turn, and they report
// nothing.
func (req *request) withdrawAfter(from int) {
	for i := from; i < len(req.records); i++ {
		rec := &req.records[i]
		if rec.phase != askedAhead {
			continue
		}
		if rec.adm.Held() > 0 {
			_, _ = rec.adm.Release(settleContext)
		}
		rec.phase = pending
	}
}

// take asks rec's store for its decision, timing it when the zone's
// decisions are measured (metrics or samples).
func (rec *zoneRecord) take(ctx context.Context) {
	if !rec.zone.timed {
		rec.takeFrom(ctx, rec.limit.store)
		return
	}
	start := sinceStart()
	rec.takeFrom(ctx, rec.limit.store)
	rec.took = sinceStart() - start
}

// takeFrom asks s to take the record's cost of its state, answering into
// rec.adm and rec.err (an Admission is 128 bytes: returned through one
// more function, it is zeroed and copied twice more on every request). A
// request of cost 0 (a per-request cost may be 0) takes nothing, yet
// passes only while the key has a unit left, so a key that is spent or
// owes is refused whatever cost its requests claim: it takes a unit and
// gives it back at once.
func (rec *zoneRecord) takeFrom(ctx context.Context, s limiter.Store) {
	if rec.cost > 0 {
		rec.adm, rec.err = s.Take(ctx, rec.state, rec.cost)
		return
	}
	rec.adm, rec.err = s.Take(ctx, rec.state, 1)
	a := &rec.adm
	if rec.err != nil || !a.Allowed {
		return
	}
	if st, err := a.GiveBack(context.WithoutCancel(ctx), 1); err == nil {
		a.Remaining, a.ResetAfter = st.Remaining, st.ResetAfter
	}
}

// processStart anchors sinceStart.
var processStart = time.Now()

// sinceStart is the monotonic time since the process started: what timing
// a decision needs, at about half the cost of time.Now, which also reads the
// wall clock.
func sinceStart() time.Duration { return time.Since(processStart) }

// decideRecord decides rec, and reports whether it ends the decisions: a
// refusal, or a failure of a `fail closed` zone.
func (h *Handler) decideRecord(r *http.Request, req *request, rec *zoneRecord) (stop bool) {
	z, l := rec.zone, rec.limit
	if rec.phase == blocked {
		return h.refuseUnasked(r, rec)
	}
	if rec.phase == pending {
		rec.take(r.Context())
	}
	if z.timed && l.remote {
		z.metrics.observe(rec.took)
	}
	if err := rec.err; err != nil {
		left := r.Context().Err()
		if left == nil || !errors.Is(err, left) {
			// The store failed, whether or not the client has left
			// since. A client's leaving alone (its request queued
			// behind a lease call) says nothing of the store, as the
			// Redis breaker holds too.
			z.metrics.failure()
			h.logStoreFailure(z, err)
		}
		if left != nil {
			// Nobody waits for an answer: no fail mode applies (no 503
			// to nobody, no request passed on unlimited, no fallback
			// unit taken).
			return req.clientLeft(rec, left)
		}
		switch {
		case z.fail == failClosed && z.dryRun:
			// dry_run never refuses: the 503 the zone would have
			// answered is logged (logStoreFailure) and counted in
			// store_failures_total, and the zone lets the request
			// through as `fail open` does.
			req.decidesNothing(rec)
			return false
		case z.fail == failClosed:
			rec.phase = failed
			req.failure = err
			return true
		case z.fail == failLocal && l.fallback != nil:
			rec.fallback = true
			if rec.takeFrom(r.Context(), l.fallback); rec.err != nil {
				rec.phase = undecided
				return false
			}
		default: // open: this zone does not limit, nor report
			req.decidesNothing(rec)
			return false
		}
	}
	if l.remote {
		// A Redis call runs to its answer whoever leaves; a memory
		// decision does not wait, so it does not check.
		if left := r.Context().Err(); left != nil {
			return req.clientLeft(rec, left)
		}
	}
	d := rec.decision()
	if !d.Allowed && !rec.until.IsZero() {
		// Past the override's expiry the key is decided afresh by its
		// tier or zone: a refusal under it waits no longer.
		left := max(time.Millisecond, rec.until.Sub(h.now()))
		d.RetryAfter, d.ResetAfter = min(d.RetryAfter, left), min(d.ResetAfter, left)
	}
	res := resultAllowed
	if !d.Allowed {
		res = z.overLimit()
	}
	switch res {
	case resultAllowed:
		rec.phase = admitted
	case resultPassed:
		rec.phase = passedOn
	default:
		rec.phase = refused
	}
	if d.Allowed && z.watches {
		req.watches = true
	}
	z.metrics.count(res, d.Source)
	z.hot.Add(maphash.String(hotSeed, rec.key), rec.key, !d.Allowed)
	if z.timed {
		h.sample(z, rec.key, *d, rec.source(), rec.took)
	}
	switch {
	case res == resultDryRunDenied:
		h.logDenial(r, z, rec.key, *d, res)
	case res == resultPassed:
		// The request goes on holding nothing here (a refusal holds
		// nothing) and is neither held nor settled by this zone; the
		// response only loses the zone's response_cost field.
		h.logDenial(r, z, rec.key, *d, res)
		req.watches = req.watches || rec.stripsResponseCost()
	case res == resultDenied:
		return true
	case l.traits.HoldsRequests && d.RetryAfter > req.hold && !z.dryRun:
		// A dry run shapes nothing: it reports the hold in its headers
		// but does not make the request wait.
		req.hold = d.RetryAfter
	}
	return false
}

// clientLeft ends req, whose client left (err, its context's error) while
// rec's store decided: rec fails, and the request ends as a held one
// whose client leaves does, with 499 (refuse) and what every zone took,
// rec's included, given back (releaseAll). It reports true: the
// decisions stop.
func (req *request) clientLeft(rec *zoneRecord, err error) bool {
	rec.phase = failed
	req.failure = caddyhttp.Error(statusClientClosedRequest, err)
	return true
}

// refuseUnasked decides a blocked record: refused without asking its
// store, for as long as its wait, or its zone's window for a missing key.
func (h *Handler) refuseUnasked(r *http.Request, rec *zoneRecord) (stop bool) {
	z := rec.zone
	d, source := limiter.Decision{RetryAfter: rec.limit.window}, sourceMissingKey
	if rec.wait > 0 {
		d = limiter.Decision{RetryAfter: rec.wait, ResetAfter: rec.wait}
		source = sourceOverride
	}
	rec.adm = limiter.Admission{Decision: d}
	rec.phase = refused
	// `exceeded pass` passes on a request over the limit, not a blocked
	// key or a missing one.
	res := resultDenied
	if z.dryRun {
		res = resultDryRunDenied
	}
	z.metrics.count(res, limiter.SourceStore)
	h.sample(z, rec.key, limiter.Decision{}, source, 0)
	if z.dryRun {
		h.logDenial(r, z, rec.key, d, res)
		return false
	}
	return true
}

// overLimit is what z does with a request over its limit: refuses it,
// passes it on (`exceeded pass`), or in a dry run neither.
func (z *zone) overLimit() decisionResult {
	switch {
	case z.dryRun:
		return resultDryRunDenied
	case z.passExceeded:
		return resultPassed
	}
	return resultDenied
}

// source names where rec was decided, for samples.
func (rec *zoneRecord) source() string {
	return sourceOf(rec.limit, rec.fallback, rec.decision().Source)
}

// decidesNothing makes rec undecided: its zone applies to the request but
// neither limits nor reports it, and only removes its response_cost field,
// for which the response is watched.
func (req *request) decidesNothing(rec *zoneRecord) {
	rec.phase = undecided
	req.watches = req.watches || rec.stripsResponseCost()
}

// stripsResponseCost reports whether the response's response_cost field
// of rec's zone is removed before the client sees it.
func (rec *zoneRecord) stripsResponseCost() bool {
	rc := rec.zone.responseCost
	return rc != nil && !rc.Keep
}

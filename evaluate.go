package ratelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/http"
	"path"
	"reflect"
	"runtime"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// statusClientClosedRequest is the status logged when a client leaves
// while its request is held by a leaky bucket.
const statusClientClosedRequest = 499

// outcome is one zone's decision on one request.
type outcome struct {
	zone  *zone
	limit *limit
	// store decided: the limit's own, or its local fallback.
	store limiter.Store
	// key is the request's key, and state the name of its state in
	// store (candidate.state).
	key, state string
	// cost is what the request took up front.
	cost int64
	d    limiter.Decision
	// taken is true when the store consumed units that must be refunded
	// if the request is refused, or when it finishes for an algorithm
	// that releases on finish.
	taken bool
	// reported is the zone's response_cost header as the response
	// header was written.
	reported string
	// counted is set once the response matched the zone's count_response,
	// and settled once the response settled what the zone took (see
	// outcome.settle).
	counted, settled bool
}

// evaluation is every zone's decision on one request.
type evaluation struct {
	outcomes []outcome
	// candidates are the zones that match the request, with their keys,
	// before any is decided.
	candidates []candidate
	// denied indexes the outcome that refuses the request, or is -1.
	denied int
	// hold is the longest time a leaky bucket asked the request to wait.
	hold time.Duration
	// failed is the store error of a `fail closed` zone, which refuses
	// the request with 503.
	failed error
	// claims is the request's token as this handler's jwt block verifies
	// it, which keys and tiers read directly; nil without a jwt block.
	claims *jwtClaims
	// watches is set when a zone that admitted the request settles its
	// cost by the response (count_response, response_cost); watch then
	// sees the response (see serveWatched).
	watches bool
	watch   responseWatch
	// undecided are the response_cost zones (without keep) that applied
	// to the request but decided nothing, their store having failed open:
	// their cost field is removed from the response all the same.
	undecided []*zone
}

// candidate is a zone that matches a request, its limit and its key.
type candidate struct {
	zone  *zone
	limit *limit
	key   string
	// state is the name of key's state in limit's store: key, or under
	// an override limit its StateKey.
	state string
	// cost is the request's cost in this zone.
	cost int64
	// missingDeny is set when the key is missing and the zone refuses
	// such requests.
	missingDeny bool
	// blocked is set when the key's override blocks it: the request is
	// refused, told to wait that long.
	blocked time.Duration
	// until is when the key's override limit lapses (zero: never, or no
	// override): a refusal under it is told to wait no longer than that,
	// since the key is then decided by its tier or zone again.
	until time.Time
	// undecided is set when the zone applies to the request but decides
	// nothing for it (its key is exempt, missing under `missing_key skip`,
	// or its dry_run cost is invalid): its response_cost field is still
	// removed, since the upstream's field is never the client's.
	undecided bool
	// early is set when the decision was asked for ahead of its turn,
	// together with the request's other remote zones; d and err hold it.
	early bool
	d     limiter.Decision
	err   error
	// took is how long the store took to decide, when the zone is timed.
	took time.Duration
}

// take asks c's store for its decision, timing it when the zone's
// decisions are measured (metrics or samples).
func (c *candidate) take(ctx context.Context) {
	if !c.zone.timed {
		c.d, c.err = takeCost(ctx, c.limit.store, c.state, c.cost)
		return
	}
	start := sinceStart()
	c.d, c.err = takeCost(ctx, c.limit.store, c.state, c.cost)
	c.took = sinceStart() - start
}

// takeCost asks s to take cost units of key. A request of cost 0 (a
// per-request cost may be 0) takes nothing, yet passes only while the key
// has a unit left, so a key that is spent or owes is refused whatever
// cost its requests claim: it takes a unit and gives it back at once.
func takeCost(ctx context.Context, s limiter.Store, key string, cost int64) (limiter.Decision, error) {
	if cost > 0 {
		return s.Take(ctx, key, cost)
	}
	d, err := s.Take(ctx, key, 1)
	if err != nil || !d.Allowed {
		return d, err
	}
	if st, err := s.Refund(context.WithoutCancel(ctx), key, 1, d); err == nil {
		d.Remaining, d.ResetAfter = st.Remaining, st.ResetAfter
	}
	return d, nil
}

// processStart anchors sinceStart.
var processStart = time.Now()

// sinceStart is the monotonic time since the process started: what timing
// a decision needs, at about half the cost of time.Now, which also reads the
// wall clock.
func sinceStart() time.Duration { return time.Since(processStart) }

// evaluations recycles evaluation buffers: the request path allocates
// none of its own.
var evaluations = sync.Pool{New: func() any {
	return &evaluation{outcomes: make([]outcome, 0, 4), candidates: make([]candidate, 0, 4)}
}}

func getEvaluation() *evaluation {
	ev := evaluations.Get().(*evaluation)
	ev.denied, ev.hold, ev.failed, ev.claims, ev.watches = -1, 0, nil, nil, false
	return ev
}

// putEvaluation recycles ev, dropping its references to keys and zones.
func putEvaluation(ev *evaluation) {
	clear(ev.outcomes)
	ev.outcomes = ev.outcomes[:0]
	clear(ev.candidates)
	ev.candidates = ev.candidates[:0]
	clear(ev.undecided)
	ev.undecided = ev.undecided[:0]
	evaluations.Put(ev)
}

// evaluate decides every zone that matches r, in name order, stopping at the
// first that refuses it. A request that matches several Redis zones asks
// all of them at once rather than one round trip after another; what the
// zones after a refusal took is then given back, so the outcome is the
// same as deciding them in turn.
func (h *Handler) evaluate(r *http.Request, repl *caddy.Replacer, ev *evaluation) error {
	together := h.remoteZones > 1
	var c candidate
	for _, z := range h.zones {
		c.undecided = false
		ok, err := h.match(z, r, repl, ev.claims, &c)
		if err != nil {
			return err
		}
		if !ok {
			if c.undecided {
				ev.decidedNothing(z)
			}
			continue
		}
		if !together {
			// Decided at once, as matched: no list to keep.
			if h.decide(r, ev, &c) {
				return nil
			}
			continue
		}
		ev.candidates = append(ev.candidates, c)
		if c.refusedUnasked() && !z.dryRun {
			break // the zones after it are not evaluated
		}
	}
	if !together {
		return nil
	}
	ev.decideRemoteEarly(r.Context())
	for i := range ev.candidates {
		if h.decide(r, ev, &ev.candidates[i]) {
			ev.refundEarly(r.Context(), i+1)
			return nil
		}
	}
	return nil
}

// match reports whether zone z applies to r and, if so, sets c to it with
// its limit and key. claims are the request's verified token, or nil.
func (h *Handler) match(z *zone, r *http.Request, repl *caddy.Replacer, claims *jwtClaims, c *candidate) (bool, error) {
	if len(z.matchers) > 0 {
		ok, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return false, caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if !ok {
			return false, nil
		}
	}
	tier := z.tierValue(r, repl, claims)
	key, ok := z.key.evaluate(r, repl, claims)
	// Override, then tier, then the zone's own limit, on the handler's
	// clock (the zone's).
	res := z.resolve(key, ok, tier, r, time.Time{})
	*c = candidate{zone: z, limit: res.limit, key: res.key, state: res.state, until: res.until}
	if res.inForce {
		z.metrics.override(res.override.Action)
		if res.failed != nil {
			z.logOverrideFailure(h.logger, res.failed)
		}
	}
	switch res.verdict {
	case verdictSkip:
		c.undecided = true
		return false, nil
	case verdictDeny:
		c.missingDeny = true
		return true, nil
	case verdictExempt:
		// Not limited: the zone writes none of its fields.
		z.metrics.count(true, z.dryRun, limiter.SourceStore)
		c.undecided = true
		return false, nil
	case verdictBlock:
		c.blocked = res.wait
		return true, nil // refused whatever it would cost
	}
	if err := h.requestCost(r, repl, claims, c); err != nil {
		if !z.dryRun {
			return false, err
		}
		// dry_run never refuses: the 400 is logged (requestCost) and
		// counted as a refusal the zone would have made, and the zone
		// does not apply to this request.
		z.metrics.count(false, true, limiter.SourceStore)
		c.undecided = true
		return false, nil
	}
	return true, nil
}

// decideRemoteEarly asks the stores of the request's remote zones at once,
// when there are two or more: each on a goroutine of its own but the
// last, which is asked on this one.
func (ev *evaluation) decideRemoteEarly(ctx context.Context) {
	n := 0
	for i := range ev.candidates {
		if ev.candidates[i].remoteTake() {
			n++
		}
	}
	if n < 2 {
		return // one is asked in its turn, as fast
	}
	var (
		wg   sync.WaitGroup
		last *candidate
	)
	for i := range ev.candidates {
		c := &ev.candidates[i]
		if !c.remoteTake() {
			continue
		}
		c.early = true
		if last != nil {
			wg.Add(1)
			go func(c *candidate) {
				defer wg.Done()
				c.take(ctx)
			}(last)
		}
		last = c
	}
	last.take(ctx)
	wg.Wait()
}

// remoteTake reports whether c is decided by a remote store's Take.
func (c *candidate) remoteTake() bool { return c.limit.remote && !c.refusedUnasked() }

// refusedUnasked reports whether c is refused without asking its store:
// its key is missing and the zone denies such requests, or its override
// blocks it.
func (c *candidate) refusedUnasked() bool { return c.missingDeny || c.blocked > 0 }

// refundEarly refunds what the remote zones from candidates[from:] took
// ahead of their turn, since the request stopped before it.
func (ev *evaluation) refundEarly(ctx context.Context, from int) {
	for i := from; i < len(ev.candidates); i++ {
		c := &ev.candidates[i]
		if c.early && c.err == nil && c.d.Allowed && c.cost > 0 {
			_, _ = c.limit.store.Refund(context.WithoutCancel(ctx), c.state, c.cost, c.d)
		}
	}
}

// decide records c's decision on r, and reports whether it ends the
// evaluation: a refusal, or a failure of a `fail closed` zone.
func (h *Handler) decide(r *http.Request, ev *evaluation, c *candidate) (stop bool) {
	z, l := c.zone, c.limit
	if c.refusedUnasked() {
		d, source := limiter.Decision{RetryAfter: l.window}, sourceMissingKey
		if c.blocked > 0 {
			d = limiter.Decision{RetryAfter: c.blocked, ResetAfter: c.blocked}
			source = sourceOverride
		}
		ev.outcomes = append(ev.outcomes, outcome{zone: z, limit: l, key: c.key, d: d})
		z.metrics.count(false, z.dryRun, limiter.SourceStore)
		h.sample(z, c.key, limiter.Decision{}, source, 0)
		if z.dryRun {
			h.logDenial(r, z, c.key, d, true)
			return false
		}
		ev.denied = len(ev.outcomes) - 1
		return true
	}
	if !c.early {
		c.take(r.Context())
	}
	if z.timed && l.remote {
		z.metrics.observe(c.took)
	}
	store, d, err := l.store, c.d, c.err
	if err != nil {
		z.metrics.failure()
		h.logStoreFailure(z, err)
		switch {
		case z.fail == failClosed && z.dryRun:
			// dry_run never refuses: the 503 the zone would have
			// answered is logged (logStoreFailure) and counted in
			// store_failures_total, and the zone lets the request
			// through as `fail open` does.
			ev.decidedNothing(z)
			return false
		case z.fail == failClosed:
			ev.failed = err
			return true
		case z.fail == failLocal && l.local != nil:
			store = l.local
			if d, err = takeCost(r.Context(), store, c.state, c.cost); err != nil {
				return false
			}
		default: // open: this zone does not limit, nor report
			ev.decidedNothing(z)
			return false
		}
	}
	if !d.Allowed && !c.until.IsZero() {
		// Past the override's expiry the key is decided afresh by its
		// tier or zone: a refusal under it waits no longer.
		left := max(time.Millisecond, c.until.Sub(h.now()))
		d.RetryAfter, d.ResetAfter = min(d.RetryAfter, left), min(d.ResetAfter, left)
	}
	ev.outcomes = append(ev.outcomes, outcome{zone: z, limit: l, store: store, key: c.key, state: c.state, cost: c.cost, d: d, taken: d.Allowed && c.cost > 0})
	if d.Allowed && z.watches {
		ev.watches = true
	}
	z.metrics.count(d.Allowed, z.dryRun, d.Source)
	z.hot.Add(maphash.String(hotSeed, c.key), c.key, !d.Allowed)
	if z.timed {
		h.sample(z, c.key, d, sourceOf(l, store, d), c.took)
	}
	switch {
	case !d.Allowed && z.dryRun:
		h.logDenial(r, z, c.key, d, true)
	case !d.Allowed:
		ev.denied = len(ev.outcomes) - 1
		return true
	case l.traits.HoldsRequests && d.RetryAfter > ev.hold && !z.dryRun:
		// A dry run shapes nothing: it reports the hold in its headers
		// but does not make the request wait.
		ev.hold = d.RetryAfter
	}
	return false
}

// decidedNothing notes a zone that applied to the request but decided
// nothing: one whose response_cost field must still be removed.
func (ev *evaluation) decidedNothing(z *zone) {
	if rc := z.responseCost; rc != nil && !rc.Keep {
		ev.undecided = append(ev.undecided, z)
		ev.watches = true
	}
}

// refund gives back what the zones took: everything, when the request is
// refused; when it finished, what it only held while it ran (see
// limiter.Traits.ReleasesOnFinish).
func (ev *evaluation) refund(r *http.Request, finished bool) {
	var ctx context.Context
	for i := range ev.outcomes {
		o := &ev.outcomes[i]
		if !o.taken || (finished && !o.limit.traits.ReleasesOnFinish) {
			continue
		}
		o.taken = false
		if ctx == nil {
			ctx = context.WithoutCancel(r.Context())
		}
		// Report the state after the refund, not the units it gave back.
		if st, err := o.store.Refund(ctx, o.state, o.cost, o.d); err == nil {
			o.d.Remaining, o.d.ResetAfter = st.Remaining, st.ResetAfter
		}
	}
}

// done ends a request that passed: it refunds what the request held and
// recycles ev. Deferred by ServeHTTP, so a panic further down the chain
// refunds too.
func (ev *evaluation) done(r *http.Request) {
	ev.refund(r, true)
	putEvaluation(ev)
}

// deny answers a refused request: headers, placeholders, and a 429 error
// for the server's handle_errors routes, or the 429 itself when the server
// has none.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, ev *evaluation) error {
	o := &ev.outcomes[ev.denied]
	wait := o.d.RetryAfter
	if h.Jitter > 0 && o.limit != &o.zone.ov.block {
		// A block's wait is when it lapses, told as it is.
		wait += time.Duration(rand.Float64() * h.Jitter * float64(wait))
	}
	retry := max(1, ceilSeconds(wait))
	h.writeHeaders(w.Header(), ev, retry)
	placeholdersFor(r, repl).decide(ev, retry)
	h.logDenial(r, o.zone, o.key, o.d, false)
	h.events.exceeded(r, o.zone, wait)
	if !hasErrorRoutes(r) {
		// Caddy would only log the error at debug level and write the
		// status, after building the log fields and cloning the request
		// whether or not anything is logged: under a flood of refusals
		// that costs more than the refusal. Write the 429 here instead.
		w.WriteHeader(http.StatusTooManyRequests)
		return nil
	}
	return refusal(o.zone.exceeded)
}

// hasErrorRoutes reports whether r's server has handle_errors routes that
// a returned error would reach. When the server is unknown it says yes, so
// the refusal takes Caddy's error path, as it always may.
func hasErrorRoutes(r *http.Request) bool {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return true
	}
	return srv.Errors != nil && len(srv.Errors.Routes) > 0
}

// refusal is the 429 error caddyhttp.Error(http.StatusTooManyRequests, err)
// would return: a fresh ID to correlate logs and a Trace naming where it
// was raised. caddyhttp.Error finds that place with runtime.Caller on every
// call, which under a flood of refused requests costs more than the rest of
// the refusal; it is always deny, so it is found once.
func refusal(err error) error {
	return caddyhttp.HandlerError{
		ID:         newErrorID(),
		StatusCode: http.StatusTooManyRequests,
		Err:        err,
		Trace:      denyTrace(),
	}
}

// denyTrace is deny's location in caddyhttp.Error's Trace format, found
// on first use. TestRefusalMatchesCaddyError pins the format and the ID
// alphabet to caddyhttp.Error's own.
func denyTrace() string {
	denyTraceOnce.Do(func() {
		f := runtime.FuncForPC(reflect.ValueOf((*Handler).deny).Pointer())
		if f == nil {
			return
		}
		file, line := f.FileLine(f.Entry())
		denyTraceText = formatTrace(f.Name(), file, line)
	})
	return denyTraceText
}

// formatTrace writes a code location as caddyhttp.Error's Trace does:
// "<package>.<function> (<file>:<line>)".
func formatTrace(function, file string, line int) string {
	return fmt.Sprintf("%s (%s:%d)", path.Base(function), path.Base(file), line)
}

var (
	denyTraceOnce sync.Once
	denyTraceText string
)

// errorIDChars are the characters of Caddy's error IDs (lower case, no
// look-alikes), so refusals' IDs look like every other error's.
const errorIDChars = "abcdefghijkmnpqrstuvwxyz23456789"

// newErrorID returns a random 9-character error ID, as caddyhttp.Error
// makes, from a single random number.
func newErrorID() string {
	var b [9]byte
	x := rand.Uint64()
	for i := range b {
		b[i] = errorIDChars[x&31]
		x >>= 5
	}
	return string(b[:])
}

// failLogInterval is how often a zone logs that its store is failing.
const failLogInterval = 10 * time.Second

// logStoreFailure logs that a zone's store failed and which fail mode
// applies, at most once per failLogInterval per zone.
func (h *Handler) logStoreFailure(z *zone, err error) {
	now := h.now().UnixNano()
	last := z.failLogged.Load()
	if now-last < int64(failLogInterval) || !z.failLogged.CompareAndSwap(last, now) {
		return
	}
	if z.dryRun && z.fail == failClosed {
		h.logger.Warn("rate limit store failed; dry_run lets requests through that fail closed would refuse",
			zap.String("zone", z.name), zap.String("fail", z.fail), zap.Bool("dry_run", true),
			zap.Int("would_refuse", http.StatusServiceUnavailable), zap.Error(err))
		return
	}
	h.logger.Warn("rate limit store failed; applying fail mode",
		zap.String("zone", z.name), zap.String("fail", z.fail), zap.Error(err))
}

// logDenial logs a refusal at debug level: under a flood, one line per
// refused request would cost more than the refusal itself. The access log
// records every 429.
func (h *Handler) logDenial(r *http.Request, z *zone, key string, d limiter.Decision, dryRun bool) {
	if !h.debugDenials {
		return
	}
	ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded")
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("zone", z.name),
		zap.Duration("wait", d.RetryAfter),
		zap.String("remote_ip", z.key.clientIP(r)),
		zap.Bool("dry_run", dryRun),
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", key))
	}
	ce.Write(fields...)
}

// holdRequest waits d before the request continues, as a leaky bucket
// shapes traffic. A client that leaves meanwhile ends the wait; its slot is
// not given back, since the bucket already spaced others after it.
func holdRequest(r *http.Request, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.Context().Done():
		return caddyhttp.Error(statusClientClosedRequest, r.Context().Err())
	}
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

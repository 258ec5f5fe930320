package ratelimit

import (
	"iter"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// A request passes through the handler in phases, each in a file of its
// own (docs/design.md, "The request path"):
//
//  1. resolve (resolve.go): which zones apply, with the key, limit, state
//     name and cost of each: a record per zone, no store asked yet;
//  2. decide (decide.go): the stores decide the records in name order,
//     remote ones asked together, until one refuses (a record over the
//     limit of an `exceeded pass` zone is passed on, and does not stop
//     them);
//  3. respond (respond.go): headers and placeholders, then the refusal,
//     or the hold a leaky bucket asks for;
//  4. serve: the next handler, through a responseWatch when a zone settles
//     by the response;
//  5. settle (settle.go): what the response says of count_response and
//     response_cost;
//  6. finish: concurrency slots released, the request's record recycled.
//
// Every unit a store took is held by the record's limiter.Admission, and
// comes back through it only.

// phase is where one zone's record stands in a request.
type phase uint8

// The phases of a zone's record, in the order a record passes them. A
// record is reported in the response's fields from refused on.
const (
	// pending: resolved; its store is asked in turn.
	pending phase = iota
	// askedAhead: its store was asked together with the request's other
	// remote zones; the answer waits in adm and err.
	askedAhead
	// blocked: refused without asking a store, its key missing under
	// missing_key deny or blocked by an override; wait says how long.
	blocked
	// undecided: the zone applies but decides nothing (its key is exempt
	// or missing under missing_key skip, its dry_run cost is invalid, its
	// store failed open): its response_cost field is still removed.
	undecided
	// failed: its store failed under fail closed; the request is answered
	// 503.
	failed
	// refused: the zone refused the request (or, in dry_run, would have).
	refused
	// passedOn: the request is over the zone's limit and the zone passes
	// it on (`exceeded pass`): it holds nothing, and settles nothing by
	// the response, but its state is reported.
	passedOn
	// admitted: the zone admitted the request; adm holds what it took.
	admitted
	// counted: the response's header matched the zone's count_response; a
	// response_cost may still come in a trailer.
	counted
	// settled: the response settled what the zone took.
	settled
)

// reports is whether the record's decision is reported to the client.
func (p phase) reports() bool { return p >= refused }

// zoneRecord is one zone's part in one request, from resolution to
// settlement.
type zoneRecord struct {
	zone  *zone
	limit *limit
	// key is the request's key in the zone, and state the name of its
	// state in the limit's store: key, or under an override its StateKey.
	key, state string
	// cost is what the request takes up front.
	cost  int64
	phase phase
	// fallback is set when the limit's local fallback decided, its store
	// having failed under fail local.
	fallback bool
	// wait is, for a blocked record, how long the client is told to wait.
	wait time.Duration
	// until is when the key's override limit lapses (zero: never, or no
	// override): a refusal under it is told to wait no longer than that,
	// since the key is then decided by its tier or zone again.
	until time.Time
	// adm is the store's answer: its Decision is what the response
	// reports, and it holds the units the request took.
	adm limiter.Admission
	err error
	// took is how long the store took to decide, when the zone is timed.
	took time.Duration
	// reported is the zone's response_cost header as the response header
	// was written.
	reported string
	// noted is what resolution found that counts only once the record's
	// turn comes (zoneRecord.count): a zone after a refusal is resolved
	// but never decided, and counts nothing.
	noted resolveNotes
}

// resolveNotes are the findings of resolution that metrics and logs count
// when the request is decided in the record's turn.
type resolveNotes struct {
	// override is the action of the key's override in force, 0 for none;
	// overrideErr is why its limit could not be applied.
	override    limiter.OverrideAction
	overrideErr error
	// exempt counts the request allowed; badCost counts a dry_run zone's
	// invalid cost as the refusal it would have made.
	exempt, badCost bool
}

// decision is what the record reports.
func (rec *zoneRecord) decision() *limiter.Decision { return &rec.adm.Decision }

// request is one request's records, one per zone that applies, in name
// order, and what they decided together.
type request struct {
	records []zoneRecord
	// refusal indexes the record that refuses the request, or is -1.
	refusal int
	// passing indexes the first record passed on over its limit
	// (passedOn), or is -1: the zone {http.rate_limit.exceeded.name}
	// names unless another refuses the request.
	passing int
	// failure is the store error of a `fail closed` zone, which refuses
	// the request with 503.
	failure error
	// hold is the longest time a leaky bucket asked the request to wait.
	hold time.Duration
	// claims is the request's token as this handler's jwt block verifies
	// it, which keys and tiers read directly; nil without a jwt block.
	claims *jwtClaims
	// watches is set when a record settles by the response (see
	// serveWatched).
	watches bool
	watch   responseWatch
}

// requests recycles request records: the request path allocates none of
// its own.
var requests = sync.Pool{New: func() any {
	return &request{records: make([]zoneRecord, 0, 4)}
}}

func getRequest() *request {
	req := requests.Get().(*request)
	req.refusal, req.passing, req.failure, req.hold, req.claims, req.watches = -1, -1, nil, 0, nil, false
	return req
}

// putRequest recycles req, dropping its references to keys and zones.
func putRequest(req *request) {
	clear(req.records)
	req.records = req.records[:0]
	requests.Put(req)
}

// nextRecord is a zero record appended to req's: the pooled slice's
// slots beyond its length are zero (putRequest clears what was used), so
// it is written once, by match.
func (req *request) nextRecord() *zoneRecord {
	if n := len(req.records); n < cap(req.records) {
		req.records = req.records[:n+1]
	} else {
		req.records = append(req.records, zoneRecord{})
	}
	return &req.records[len(req.records)-1]
}

// dropLast removes the last record, leaving its slot zero for the next.
func (req *request) dropLast() {
	n := len(req.records) - 1
	req.records[n] = zoneRecord{}
	req.records = req.records[:n]
}

// reportedRecords yields, in name order, the records reported to the
// client (phase.reports) with their index.
func (req *request) reportedRecords() iter.Seq2[int, *zoneRecord] {
	return func(yield func(int, *zoneRecord) bool) {
		for i := range req.records {
			if rec := &req.records[i]; rec.phase.reports() && !yield(i, rec) {
				return
			}
		}
	}
}

// reporting counts the records reported to the client.
func (req *request) reporting() int {
	n := 0
	for range req.reportedRecords() {
		n++
	}
	return n
}

// ServeHTTP decides the request and, if it may pass, hands it to next.
// The deciding happens in admit, whose frame is gone before next runs:
// everything after this handler runs on top of ServeHTTP's frame, and a
// deep enough chain makes every connection's goroutine grow its stack
// again after each garbage collection shrinks it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if f := h.inflight; f != nil {
		f.enter()
		defer f.leave()
	}
	req, pass, err := h.admit(w, r)
	if !pass {
		return err
	}
	if req == nil {
		return next.ServeHTTP(w, r)
	}
	defer req.finish()
	if req.watches {
		return req.serveWatched(w, r, next)
	}
	return next.ServeHTTP(w, r)
}

// admit runs the phases before serving: resolve, decide, respond. It
// reports whether r may pass to the next handler; if not, r has been
// answered or err says how. A passing request that a zone decided comes
// with its record, which finish must recycle.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request) (req *request, pass bool, err error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	req = getRequest()
	if h.jwt != nil {
		req.claims = placeholdersFor(r, repl).useJWT(r, h.jwt)
	}
	if err := h.resolveZones(r, repl, req); err != nil {
		putRequest(req)
		return nil, false, err
	}
	h.decide(r, req)
	if req.failure != nil || req.refusal >= 0 {
		req.releaseAll()
		err := h.refuse(w, r, repl, req)
		putRequest(req)
		return nil, false, err
	}
	if req.reporting() == 0 {
		if req.watches {
			// Only to remove response_cost fields of zones that decided
			// nothing (undecided records).
			return req, true, nil
		}
		putRequest(req)
		return nil, true, nil
	}
	if err := h.pass(w, r, repl, req); err != nil {
		return nil, false, err
	}
	return req, true, nil
}

// finish ends a request that passed: it releases what the request held
// while it ran (limiter.Traits.ReleasesOnFinish) and recycles req.
// Deferred by ServeHTTP, so a panic further down the chain releases too.
func (req *request) finish() {
	for i := range req.records {
		rec := &req.records[i]
		if rec.limit != nil && rec.limit.traits.ReleasesOnFinish && rec.adm.Held() > 0 {
			_, _ = rec.adm.Release(settleContext)
		}
	}
	putRequest(req)
}

// releaseAll gives back everything the records took, for a request that
// is refused: a refused request consumes nothing. The records report
// their state after it.
func (req *request) releaseAll() {
	for i := range req.records {
		rec := &req.records[i]
		if rec.adm.Held() == 0 {
			continue
		}
		if st, err := rec.adm.Release(settleContext); err == nil {
			rec.adm.Remaining, rec.adm.ResetAfter = st.Remaining, st.ResetAfter
		}
	}
}

// now is the time on the handler's clock.
func (h *Handler) now() time.Time { return nowOn(h.clock) }

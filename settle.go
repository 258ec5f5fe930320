package ratelimit

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// responseWatch passes a response through to the client while noting what
// the zones that settle a request's cost afterwards need of it: the status
// and, when the header is written, the response_cost values, which it
// removes unless the zone keeps them. A request whose zones settle nothing
// is served without it.
type responseWatch struct {
	caddyhttp.ResponseWriterWrapper
	req         *request
	status      int
	wroteHeader bool
}

// WriteHeader settles what the final status and header settle before the
// client sees them, so a client's next request, sent once it has this
// response, is decided on the settled state. Informational statuses (1xx
// but 101) are passed on, as more follow them.
func (w *responseWatch) WriteHeader(code int) {
	if !w.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.wroteHeader, w.status = true, code
		w.req.settleHeader(code, w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write writes the header first, as net/http would, so it is seen.
func (w *responseWatch) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom writes the header first, then copies as the wrapped writer does
// (a file server's sendfile).
func (w *responseWatch) ReadFrom(r io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError writes the header first, then flushes; http.ResponseController
// finds it before it would unwrap to the writer beneath.
func (w *responseWatch) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for handlers that assert http.Flusher.
func (w *responseWatch) Flush() { _ = w.FlushError() }

// finalStatus is the response's status once the handlers after this one
// returned err: what they wrote, or for an error the status Caddy's error
// handling will answer with.
func (w *responseWatch) finalStatus(err error) int {
	if w.wroteHeader {
		return w.status
	}
	if err == nil {
		return http.StatusOK
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// serveWatched hands r to next through a responseWatch, then settles what
// the zones took by the response. The watch is the request's own, so it
// costs no allocation: the handlers after this one are done with it when
// next returns (Caddy's own, a streaming or upgraded reverse_proxy
// included, return only once their response is), and only then is the
// request recycled.
func (req *request) serveWatched(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rw := &req.watch
	*rw = responseWatch{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, req: req}
	defer req.abandonOnPanic()
	err := next.ServeHTTP(rw, r)
	req.settle(rw.finalStatus(err), w.Header())
	*rw = responseWatch{}
	return err
}

// abandonOnPanic, deferred, settles what an aborted response leaves
// unsettled (see zoneRecord.abandon), then lets the panic go on.
func (req *request) abandonOnPanic() {
	p := recover()
	if p == nil {
		return
	}
	req.abandon()
	req.watch = responseWatch{}
	panic(p)
}

// abandon settles every zone of a request that got no response: one
// whose handler panicked, or whose client left while it was held.
func (req *request) abandon() {
	for i := range req.records {
		req.records[i].abandon()
	}
}

// settleHeader settles what the response's status and header settle as
// the header is written: count_response's match, and a response_cost in
// the header; a cost that may yet come in a trailer waits for settle. It
// then removes the response_cost fields unless kept, from the header and
// from its Trailer announcement: those of every zone that applied,
// whether or not it decided (the upstream's field is never the client's).
func (req *request) settleHeader(status int, hdr http.Header) {
	strip := false
	for i := range req.records {
		rec := &req.records[i]
		if !rec.phase.reports() && rec.phase != undecided {
			continue
		}
		if rc := rec.zone.responseCost; rc != nil {
			if rec.phase != undecided {
				rec.reported = firstValue(hdr, rc.field)
			}
			strip = strip || !rc.Keep
		}
		rec.settle(status, hdr, false)
	}
	if !strip {
		return
	}
	trailers := len(hdr["Trailer"]) > 0
	for i := range req.records {
		rec := &req.records[i]
		if !rec.stripsResponseCost() || (!rec.phase.reports() && rec.phase != undecided) {
			continue
		}
		if rec.reported != "" || rec.phase == undecided {
			delete(hdr, rec.zone.responseCost.field)
		}
		if trailers {
			unannounceTrailer(hdr, rec.zone.responseCost.field)
		}
	}
}

// unannounceTrailer removes name from the response's Trailer field, so a
// trailer this handler removes is not promised to the client.
func unannounceTrailer(hdr http.Header, name string) {
	vals := hdr["Trailer"]
	if len(vals) == 0 {
		return
	}
	var kept []string
	for _, v := range vals {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" && !strings.EqualFold(f, name) {
				kept = append(kept, f)
			}
		}
	}
	if len(kept) == 0 {
		hdr.Del("Trailer")
		return
	}
	hdr["Trailer"] = []string{strings.Join(kept, ", ")}
}

// firstValue is hdr's first value for key, which is in canonical form.
func firstValue(hdr http.Header, key string) string {
	if vals := hdr[key]; len(vals) > 0 {
		return vals[0]
	}
	return ""
}

// settle settles, once the handlers after this one are done, what the
// header did not: a cost sent in a trailer, and everything when no header
// was written (a handler error, answered by Caddy's error routes with
// status). Every record reads its cost before any field is removed, since
// zones may share one field. It then removes the response_cost trailers
// the handlers set after the body, unless kept: those of the zones whose
// cost came in a trailer or not at all (a response that gave its cost in
// the header is not searched for a second copy), and those of zones that
// decided nothing.
func (req *request) settle(status int, hdr http.Header) {
	// Every record reads its cost before any field is removed, since
	// zones may share one field.
	for i := range req.records {
		rec := &req.records[i]
		if rc := rec.zone.responseCost; rc != nil && rec.reported == "" && (rec.phase == admitted || rec.phase == counted) {
			if rec.reported = firstValue(hdr, rc.field); rec.reported == "" {
				rec.reported = firstValue(hdr, rc.trailerField)
			}
		}
	}
	for i := range req.records {
		rec := &req.records[i]
		switch {
		case rec.phase == undecided:
			if rec.stripsResponseCost() {
				delete(hdr, rec.zone.responseCost.field)
				delete(hdr, rec.zone.responseCost.trailerField)
			}
		case rec.phase.reports():
			wasSettled := rec.phase == settled
			rec.settle(status, hdr, true)
			if rec.stripsResponseCost() && !wasSettled {
				delete(hdr, rec.zone.responseCost.field)
				delete(hdr, rec.zone.responseCost.trailerField)
			}
		}
	}
}

// settle gives back, or takes more of, what rec's zone took up front, by
// the response: a count_response zone gives the units back when the
// response does not match; a response_cost zone takes the difference to
// the cost the response reports, or gives it back. With last unset (the
// header is being written) a response_cost that may yet come in a
// trailer is left for the last call.
func (rec *zoneRecord) settle(status int, hdr http.Header, last bool) {
	z := rec.zone
	if !z.watches || (rec.phase != admitted && rec.phase != counted) {
		return
	}
	if z.countResponse != nil && rec.phase == admitted {
		if !z.countResponse.Match(status, hdr) {
			rec.phase = settled
			rec.giveBack(rec.adm.Held())
			return
		}
		rec.phase = counted
	}
	if z.responseCost != nil {
		if rec.reported == "" && !last {
			return
		}
		rec.chargeResponse(settleContext, hdr)
	}
	rec.phase = settled
}

// settleContext is what settling asks stores in: not the request's
// context, which ends with the client's connection, since what a response
// settles must reach the store all the same.
var settleContext = context.Background()

// chargeResponse settles rec by the cost its response reports, in the
// header (read as it was written) or in a trailer: the difference to the
// cost taken up front is taken, past the limit if need be, or given back.
func (rec *zoneRecord) chargeResponse(ctx context.Context, hdr http.Header) {
	rc, m := rec.zone.responseCost, rec.zone.metrics
	v := rec.reported
	if v == "" {
		if v = firstValue(hdr, rc.field); v == "" {
			v = firstValue(hdr, rc.trailerField)
		}
	}
	if v == "" {
		m.responseCost(responseCostMissing)
		return
	}
	v = strings.TrimSpace(v)
	final, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) && v[0] != '-' {
		final, err = math.MaxInt64, nil // above any quota: capped below
	}
	if err != nil || final < 0 {
		m.responseCost(responseCostInvalid)
		return
	}
	if most := rec.limit.maxCost; final > most {
		final = most
		m.responseCost(responseCostCapped)
	} else {
		m.responseCost(responseCostRead)
	}
	switch diff := final - rec.cost; {
	case diff > 0:
		if _, err := rec.adm.Charge(ctx, diff); err != nil {
			m.failure()
		}
	case diff < 0:
		rec.giveBack(-diff)
	}
}

// giveBack gives back units of what rec took up front; a request of cost
// 0, which holds nothing, has nothing to give back.
func (rec *zoneRecord) giveBack(units int64) {
	if units <= 0 || rec.adm.Held() == 0 {
		return
	}
	if _, err := rec.adm.GiveBack(settleContext, min(units, rec.adm.Held())); err != nil {
		rec.zone.metrics.failure()
	}
}

// abandon settles rec when its response was aborted (a handler panicked,
// as reverse_proxy does with http.ErrAbortHandler when a stream breaks
// off): a count_response zone that had not matched a written header gives
// its units back, as no response matched; a response_cost not yet read
// counts as missing, and the up-front cost stands.
func (rec *zoneRecord) abandon() {
	z := rec.zone
	if !z.watches || (rec.phase != admitted && rec.phase != counted) {
		return
	}
	wasCounted := rec.phase == counted
	rec.phase = settled
	switch {
	case z.countResponse != nil && !wasCounted:
		rec.giveBack(rec.adm.Held())
	case z.responseCost != nil:
		z.metrics.responseCost(responseCostMissing)
	}
}

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

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// responseWatch passes a response through to the client while noting what
// the zones that settle a request's cost afterwards need of it: the status
// and, when the header is written, the response_cost values, which it
// removes unless the zone keeps them. A request whose zones settle nothing
// is served without it.
type responseWatch struct {
	caddyhttp.ResponseWriterWrapper
	ev          *evaluation
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
		w.ev.settleHeader(code, w.Header())
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
// the zones took by the response. The watch is the evaluation's own, so
// it costs no allocation: the handlers after this one are done with it
// when next returns (Caddy's own, a streaming or upgraded reverse_proxy
// included, return only once their response is), and only then is the
// evaluation recycled.
func (ev *evaluation) serveWatched(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rw := &ev.watch
	*rw = responseWatch{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, ev: ev}
	defer ev.abandonOnPanic()
	err := next.ServeHTTP(rw, r)
	ev.settle(rw.finalStatus(err), w.Header())
	*rw = responseWatch{}
	return err
}

// abandonOnPanic, deferred, settles what an aborted response leaves
// unsettled (see outcome.abandon), then lets the panic go on.
func (ev *evaluation) abandonOnPanic() {
	p := recover()
	if p == nil {
		return
	}
	ev.abandon()
	ev.watch = responseWatch{}
	panic(p)
}

// abandon settles every zone of a request that got no response: one
// whose handler panicked, or whose client left while it was held.
func (ev *evaluation) abandon() {
	for i := range ev.outcomes {
		ev.outcomes[i].abandon()
	}
}

// settleHeader settles what the response's status and header settle as
// the header is written: count_response's match, and a response_cost in
// the header; a cost that may yet come in a trailer waits for settle. It
// then removes the response_cost fields unless kept, from the header and
// from its Trailer announcement.
func (ev *evaluation) settleHeader(status int, hdr http.Header) {
	strip := false
	for i := range ev.outcomes {
		o := &ev.outcomes[i]
		if rc := o.zone.responseCost; rc != nil {
			o.reported = firstValue(hdr, rc.field)
			strip = strip || !rc.Keep
		}
		o.settle(status, hdr, false)
	}
	if !strip && len(ev.undecided) == 0 {
		return
	}
	trailers := len(hdr["Trailer"]) > 0
	for _, z := range ev.undecided {
		delete(hdr, z.responseCost.field)
		if trailers {
			unannounceTrailer(hdr, z.responseCost.field)
		}
	}
	for i := range ev.outcomes {
		if rc := ev.outcomes[i].zone.responseCost; rc != nil && !rc.Keep {
			if ev.outcomes[i].reported != "" {
				delete(hdr, rc.field)
			}
			if trailers {
				unannounceTrailer(hdr, rc.field)
			}
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
// status). It then removes the response_cost trailers the handlers set
// after the body, unless kept: those of the zones whose cost came in a
// trailer or not at all (a response that gave its cost in the header is
// not searched for a second copy).
func (ev *evaluation) settle(status int, hdr http.Header) {
	for i := range ev.outcomes {
		o := &ev.outcomes[i]
		wasSettled := o.settled
		o.settle(status, hdr, true)
		if rc := o.zone.responseCost; rc != nil && !rc.Keep && !wasSettled {
			delete(hdr, rc.field)
			delete(hdr, rc.trailerField)
		}
	}
	for _, z := range ev.undecided {
		delete(hdr, z.responseCost.field)
		delete(hdr, z.responseCost.trailerField)
	}
}

// settle gives back, or takes more of, what o's zone took up front, by
// the response: a count_response zone gives the units back when the
// response does not match; a response_cost zone takes the difference to
// the cost the response reports, or gives it back. With last unset (the
// header is being written) a response_cost that may yet come in a
// trailer is left for the last call.
func (o *outcome) settle(status int, hdr http.Header, last bool) {
	z := o.zone
	if !z.watches || !o.d.Allowed || o.settled {
		return
	}
	if z.countResponse != nil && !o.counted {
		if !z.countResponse.Match(status, hdr) {
			o.settled = true
			o.giveBack(o.cost)
			return
		}
		o.counted = true
	}
	if z.responseCost != nil {
		if o.reported == "" && !last {
			return
		}
		o.chargeResponse(settleContext, hdr)
	}
	o.settled = true
}

// settleContext is what settling asks stores in: not the request's
// context, which ends with the client's connection, since what a response
// settles must reach the store all the same.
var settleContext = context.Background()

// chargeResponse settles o by the cost its response reports, in the header
// (read as it was written) or in a trailer: the difference to the cost
// taken up front is taken, past the limit if need be, or given back.
func (o *outcome) chargeResponse(ctx context.Context, hdr http.Header) {
	rc, m := o.zone.responseCost, o.zone.metrics
	v := o.reported
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
	if most := o.limit.maxCost; final > most {
		final = most
		m.responseCost(responseCostCapped)
	} else {
		m.responseCost(responseCostRead)
	}
	switch diff := final - o.cost; {
	case diff > 0:
		c, ok := o.store.(limiter.Charger)
		if !ok {
			return // validate allows response_cost only where stores charge
		}
		if _, err := c.Charge(ctx, o.state, diff); err != nil {
			m.failure()
		}
	case diff < 0:
		o.giveBack(-diff)
	}
}

// giveBack refunds units of what o took up front, once.
func (o *outcome) giveBack(units int64) {
	if !o.taken {
		return
	}
	o.taken = false
	if _, err := o.store.Refund(settleContext, o.state, units, o.d); err != nil {
		o.zone.metrics.failure()
	}
}

// abandon settles o when its response was aborted (a handler panicked,
// as reverse_proxy does with http.ErrAbortHandler when a stream breaks
// off): a count_response zone that had not matched a written header gives
// its units back, as no response matched; a response_cost not yet read
// counts as missing, and the up-front cost stands.
func (o *outcome) abandon() {
	z := o.zone
	if !z.watches || !o.d.Allowed || o.settled {
		return
	}
	o.settled = true
	switch {
	case z.countResponse != nil && !o.counted:
		o.giveBack(o.cost)
	case z.responseCost != nil:
		z.metrics.responseCost(responseCostMissing)
	}
}

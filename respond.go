package ratelimit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path"
	"reflect"
	"runtime"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// statusClientClosedRequest is the status logged when a client leaves
// while its request is held by a leaky bucket, or while a store decides.
const statusClientClosedRequest = 499

// refuse answers a request that a zone refused, or whose `fail closed`
// zone's store failed (503, Retry-After: 1), or whose client left while a
// store decided (499, to nobody: request.clientLeft).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, req *request) error {
	if failure := req.failure; failure != nil {
		if left := (caddyhttp.HandlerError{}); errors.As(failure, &left) && left.StatusCode == statusClientClosedRequest {
			return failure
		}
		w.Header().Set(hdrRetryAfter, "1")
		return caddyhttp.Error(http.StatusServiceUnavailable, failure)
	}
	return h.deny(w, r, repl, req)
}

// pass answers a request that every zone admitted: headers and
// placeholders, then the wait a leaky bucket asks for. A client that
// leaves while held ends the request (err).
func (h *Handler) pass(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, req *request) error {
	h.writeHeaders(w.Header(), req, 0)
	placeholdersFor(r, repl).decide(req, 0)
	if req.hold <= 0 {
		return nil
	}
	if err := holdRequest(r, req.hold); err != nil {
		// The client left while held: no response came, so the zones
		// settle as for an aborted one (count_response gives its units
		// back), then release what was held.
		req.abandon()
		req.finish()
		return err
	}
	return nil
}

// deny answers a refused request: headers, placeholders, and a 429 error
// for the server's handle_errors routes, or the 429 itself when the server
// has none.
func (h *Handler) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, req *request) error {
	o := &req.records[req.refusal]
	wait := o.adm.RetryAfter
	if h.Jitter > 0 && o.limit != &o.zone.ov.block {
		// A block's wait is when it lapses, told as it is.
		wait += time.Duration(rand.Float64() * h.Jitter * float64(wait))
	}
	retry := max(1, ceilSeconds(wait))
	h.writeHeaders(w.Header(), req, retry)
	placeholdersFor(r, repl).decide(req, retry)
	h.logDenial(r, o.zone, o.key, o.adm.Decision, resultDenied)
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

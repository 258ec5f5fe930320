package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// headerMode selects which rate-limit fields responses carry.
type headerMode uint8

const (
	headersBoth headerMode = iota
	headersX
	headersIETF
	headersNone
)

func parseHeaderMode(s string) (headerMode, error) {
	switch s {
	case "", "both":
		return headersBoth, nil
	case "x-ratelimit":
		return headersX, nil
	case "ietf":
		return headersIETF, nil
	case "none":
		return headersNone, nil
	}
	return 0, fmt.Errorf("unknown headers mode %q (want both, x-ratelimit, ietf or none)", s)
}

// Canonical header names, so other handlers' Header().Get finds them.
const (
	hdrLimit      = "X-Ratelimit-Limit"
	hdrRemaining  = "X-Ratelimit-Remaining"
	hdrReset      = "X-Ratelimit-Reset"
	hdrRateLimit  = "Ratelimit"
	hdrPolicy     = "Ratelimit-Policy"
	hdrRetryAfter = "Retry-After"
)

// policyItem is a zone's member of RateLimit-Policy, made once per zone:
// "<zone>";q=<quota>;w=<window seconds, rounded up, at least 1>.
func policyItem(name string, p limiter.Policy) string {
	q, w := p.Quota()
	return formatPolicyItem(name, p, q, w)
}

// policyItemAt is a calendar zone's member of RateLimit-Policy for a
// decision at t: its w is the length of the calendar window t falls in.
func policyItemAt(name string, p limiter.Policy, t time.Time) string {
	q, w := p.QuotaAt(t)
	return formatPolicyItem(name, p, q, w)
}

func formatPolicyItem(name string, p limiter.Policy, q int64, w time.Duration) string {
	b := appendSFString(nil, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, q, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, max(1, ceilSeconds(w)), 10)
	if unit := p.Algorithm.Traits().QuotaUnit; unit != "" {
		b = append(b, ";qu="...)
		b = appendSFString(b, unit)
	}
	return string(b)
}

// policyItemOf is the RateLimit-Policy member of o's zone: made once, or
// for a calendar zone, that of the window o was decided in.
func (h *Handler) policyItemOf(o *zoneRecord) string {
	c := o.limit.calendar
	if c == nil {
		return o.limit.policyItem
	}
	t := o.adm.At()
	if t.IsZero() { // a refusal no store made: missing_key deny
		t = h.now()
	}
	return c.at(t)
}

// appendSFString writes s as an RFC 9651 structured-field String. Zone
// names are printable ASCII (validate refuses others), so only the quote
// and the backslash need escaping.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// reported is the record the single-valued headers describe: the refusing
// zone's, else the first passed on over its limit (`exceeded pass`), or
// else the one with the least remaining. req reports at least one record.
func (req *request) reported() *zoneRecord {
	if req.refusal >= 0 {
		return &req.records[req.refusal]
	}
	if req.passing >= 0 {
		return &req.records[req.passing]
	}
	var best *zoneRecord
	for _, rec := range req.reportedRecords() {
		if best == nil || rec.adm.Remaining < best.adm.Remaining {
			best = rec
		}
	}
	return best
}

// writeHeaders sets the rate-limit fields for every evaluated zone, and a
// refused request's Retry-After (retry seconds, reported as the refusing
// zone's t) whatever the headers mode. All values are written into one
// buffer and share one backing array, so the headers cost two allocations
// whatever their number.
func (h *Handler) writeHeaders(hdr http.Header, req *request, retry int64) {
	refused := req.refusal >= 0
	if h.headers == headersNone && !refused {
		return
	}
	var (
		buf   [256]byte
		b     = buf[:0]
		names [6]string
		ends  [6]int // end of each value in b; -1 for policy, which is not in b
		n     int
	)
	field := func(name string, end int) {
		names[n], ends[n] = name, end
		n++
	}
	if refused {
		b = strconv.AppendInt(b, retry, 10)
		field(hdrRetryAfter, len(b))
	}
	if h.headers == headersBoth || h.headers == headersX {
		o := req.reported()
		b = append(b, o.limit.quotaText...)
		field(hdrLimit, len(b))
		b = strconv.AppendInt(b, o.adm.Remaining, 10)
		field(hdrRemaining, len(b))
		// Reset on the store's clock when it says when it decided, so a
		// window's end is reported as the second it ends in.
		base := o.adm.At()
		if base.IsZero() { // a refusal no store made: missing_key deny
			base = h.now()
		}
		reset := base.Add(o.adm.ResetAfter)
		epoch := reset.Unix()
		if reset.Nanosecond() > 0 {
			epoch++
		}
		b = strconv.AppendInt(b, epoch, 10)
		field(hdrReset, len(b))
	}
	var first *zoneRecord // the one reported, when single
	if h.headers == headersBoth || h.headers == headersIETF {
		n := 0
		for i, rec := range req.reportedRecords() {
			b, first, n = appendListSeparator(b, n), rec, n+1
			b = appendRateLimitItem(b, rec, retry, req.refusal == i)
		}
		field(hdrRateLimit, len(b))
		if n == 1 {
			// A single zone's policy was made once; use it as is.
			field(hdrPolicy, -1)
		} else {
			n = 0
			for _, rec := range req.reportedRecords() {
				b, n = appendListSeparator(b, n), n+1
				b = append(b, h.policyItemOf(rec)...)
			}
			field(hdrPolicy, len(b))
		}
	}
	all := string(b)
	vals := make([]string, n)
	start := 0
	for i := range n {
		if ends[i] < 0 {
			vals[i] = h.policyItemOf(first)
		} else {
			vals[i], start = all[start:ends[i]], ends[i]
		}
		hdr[names[i]] = vals[i : i+1 : i+1]
	}
}

// appendListSeparator separates a structured-field list's members: it
// writes ", " before every member but the first (n members written).
func appendListSeparator(b []byte, n int) []byte {
	if n > 0 {
		return append(b, ", "...)
	}
	return b
}

// appendRateLimitItem writes a zone's member of RateLimit:
// "<zone>";r=<remaining>;t=<seconds until reset, or Retry-After if it refused>.
func appendRateLimitItem(b []byte, o *zoneRecord, retry int64, refused bool) []byte {
	b = appendSFString(b, o.zone.name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, o.adm.Remaining, 10)
	b = append(b, ";t="...)
	t := ceilSeconds(o.adm.ResetAfter)
	if refused {
		t = retry
	}
	return strconv.AppendInt(b, t, 10)
}

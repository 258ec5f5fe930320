package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// headerFamilies is the set of rate-limit field families responses carry
// (the `headers` option); the empty set is `headers none`.
type headerFamilies uint8

const (
	familyXRateLimit headerFamilies = 1 << iota // X-RateLimit-Limit, -Remaining, -Reset
	familyIETF                                  // RateLimit, RateLimit-Policy: a member per zone
	familyDraft7                                // RateLimit: limit=, remaining=, reset=; RateLimit-Policy
	familyDraft6                                // RateLimit-Limit, -Remaining, -Reset, -Policy
)

// defaultHeaders are the families of a handler whose `headers` is unset,
// or set to "both", the name it had before families could be listed.
const defaultHeaders = familyXRateLimit | familyIETF

// headerFamily is one family: its name in the config and the fields it
// writes, which decide what it can be combined with.
type headerFamily struct {
	name   string
	family headerFamilies
	fields []string
}

var headerFamilyTable = []headerFamily{
	{"x-ratelimit", familyXRateLimit, []string{hdrLimit, hdrRemaining, hdrReset}},
	{"ietf", familyIETF, []string{hdrRateLimit, hdrPolicy}},
	{"draft-7", familyDraft7, []string{hdrRateLimit, hdrPolicy}},
	{"draft-6", familyDraft6, []string{hdrDraft6Limit, hdrDraft6Remaining, hdrDraft6Reset, hdrPolicy}},
}

// headerFamilyNames is what `headers` accepts, for its refusals.
const headerFamilyNames = "x-ratelimit, ietf, draft-7, draft-6, none or both"

// parseHeaderFamilies reads the `headers` option: a list of families,
// none of which writes a field another writes (both would write it, and a
// client would read one of the two or neither); "none" alone; "both"
// alone, today's default, x-ratelimit and ietf. No names is the default.
func parseHeaderFamilies(names []string) (headerFamilies, error) {
	if len(names) == 0 {
		return defaultHeaders, nil
	}
	var set headerFamilies
	picked := make([]headerFamily, 0, len(names))
	for _, name := range names {
		switch name {
		case "none", "both":
			if len(names) > 1 {
				what := "writes no field"
				if name == "both" {
					what = "is x-ratelimit and ietf: list the families instead"
				}
				return 0, fmt.Errorf("%s cannot be combined with other families (%s)", name, what)
			}
			if name == "both" {
				return defaultHeaders, nil
			}
			return 0, nil
		}
		i := slices.IndexFunc(headerFamilyTable, func(f headerFamily) bool { return f.name == name })
		if i < 0 {
			return 0, fmt.Errorf("unknown header family %q (want %s)", name, headerFamilyNames)
		}
		f := headerFamilyTable[i]
		if set&f.family != 0 {
			return 0, fmt.Errorf("%s is listed twice", name)
		}
		for _, other := range picked {
			if shared := sharedFields(other, f); len(shared) > 0 {
				return 0, fmt.Errorf("%s and %s cannot be combined: both write %s; pick one",
					other.name, f.name, strings.Join(shared, " and "))
			}
		}
		set |= f.family
		picked = append(picked, f)
	}
	return set, nil
}

// sharedFields is the fields two families both write, as operators spell
// them.
func sharedFields(a, b headerFamily) []string {
	var out []string
	for _, f := range a.fields {
		if slices.Contains(b.fields, f) {
			out = append(out, fieldSpelling[f])
		}
	}
	return out
}

// fieldSpelling is how the drafts spell the canonical names, for errors.
var fieldSpelling = map[string]string{
	hdrLimit:           "X-RateLimit-Limit",
	hdrRemaining:       "X-RateLimit-Remaining",
	hdrReset:           "X-RateLimit-Reset",
	hdrRateLimit:       "RateLimit",
	hdrPolicy:          "RateLimit-Policy",
	hdrDraft6Limit:     "RateLimit-Limit",
	hdrDraft6Remaining: "RateLimit-Remaining",
	hdrDraft6Reset:     "RateLimit-Reset",
}

// HeaderFamilies is the `headers` option in JSON: a list of family names
// (["x-ratelimit", "draft-7"]), or one name as a string ("ietf"), as the
// field was before families could be combined, so those configs still
// load.
type HeaderFamilies []string

// UnmarshalJSON reads a list of names or a single name; "" and null are
// the default, as an absent field is.
func (f *HeaderFamilies) UnmarshalJSON(b []byte) error {
	var one *string
	if err := json.Unmarshal(b, &one); err == nil {
		*f = nil
		if one != nil && *one != "" {
			*f = HeaderFamilies{*one}
		}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("headers: want a header family name or a list of them (%s): %s", headerFamilyNames, b)
	}
	*f = list
	return nil
}

// Canonical header names, so other handlers' Header().Get finds them.
const (
	hdrLimit      = "X-Ratelimit-Limit"
	hdrRemaining  = "X-Ratelimit-Remaining"
	hdrReset      = "X-Ratelimit-Reset"
	hdrRateLimit  = "Ratelimit"
	hdrPolicy     = "Ratelimit-Policy"
	hdrRetryAfter = "Retry-After"

	hdrDraft6Limit     = "Ratelimit-Limit"
	hdrDraft6Remaining = "Ratelimit-Remaining"
	hdrDraft6Reset     = "Ratelimit-Reset"
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
	return c.current(t).item
}

// policyWindowOf is the w RateLimit-Policy gives o's zone, in seconds:
// the window made once, or for a calendar zone that of the calendar window
// o was decided in.
func (h *Handler) policyWindowOf(o *zoneRecord) int64 {
	c := o.limit.calendar
	if c == nil {
		return max(1, ceilSeconds(o.limit.window))
	}
	t := o.adm.At()
	if t.IsZero() { // a refusal no store made: missing_key deny
		t = h.now()
	}
	return c.current(t).window
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

// writeHeaders sets the rate-limit fields of the handler's header
// families, and a refused request's Retry-After (retry seconds, reported
// as the refusing zone's reset) whatever the families. All values are
// written into one buffer and share one backing array, so the headers cost
// two allocations whatever their number.
func (h *Handler) writeHeaders(hdr http.Header, req *request, retry int64) {
	refused := req.refusal >= 0
	families := h.headers
	if families == 0 && !refused {
		return
	}
	var (
		buf   [256]byte
		b     = buf[:0]
		names [8]string
		ends  [8]int // end of each value in b; -1 for policy, which is not in b
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
	// The single-valued families describe one zone, the same for all.
	var o *zoneRecord
	if families&(familyXRateLimit|familyDraft7|familyDraft6) != 0 {
		o = req.reported()
	}
	if families&familyXRateLimit != 0 {
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
	if families&familyDraft7 != 0 {
		b = append(b, "limit="...)
		b = append(b, o.limit.quotaText...)
		b = append(b, ", remaining="...)
		b = strconv.AppendInt(b, o.adm.Remaining, 10)
		b = append(b, ", reset="...)
		b = strconv.AppendInt(b, resetSeconds(o, refused, retry), 10)
		field(hdrRateLimit, len(b))
		b = h.appendDraftPolicy(b, o)
		field(hdrPolicy, len(b))
	}
	if families&familyDraft6 != 0 {
		b = append(b, o.limit.quotaText...)
		field(hdrDraft6Limit, len(b))
		b = strconv.AppendInt(b, o.adm.Remaining, 10)
		field(hdrDraft6Remaining, len(b))
		b = strconv.AppendInt(b, resetSeconds(o, refused, retry), 10)
		field(hdrDraft6Reset, len(b))
		b = h.appendDraftPolicy(b, o)
		field(hdrPolicy, len(b))
	}
	var first *zoneRecord // the one reported, when single
	if families&familyIETF != 0 {
		members := 0
		for i, rec := range req.reportedRecords() {
			b, first, members = appendListSeparator(b, members), rec, members+1
			b = appendRateLimitItem(b, rec, retry, req.refusal == i)
		}
		field(hdrRateLimit, len(b))
		if members == 1 {
			// A single zone's policy was made once; use it as is.
			field(hdrPolicy, -1)
		} else {
			members = 0
			for _, rec := range req.reportedRecords() {
				b, members = appendListSeparator(b, members), members+1
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

// resetSeconds is the reset of the draft families for o, the zone they
// report: seconds until its quota is whole again, or, when it refused the
// request, Retry-After, which the drafts ask reset to agree with.
func resetSeconds(o *zoneRecord, refused bool, retry int64) int64 {
	if refused {
		return retry
	}
	return ceilSeconds(o.adm.ResetAfter)
}

// appendDraftPolicy writes the RateLimit-Policy of drafts 6 and 7 for o,
// the one zone they report: <quota>;w=<window seconds>. The drafts' field
// is a list, but two members of one quota are invalid in them and zones
// may share a quota, so it names only the zone RateLimit reports.
func (h *Handler) appendDraftPolicy(b []byte, o *zoneRecord) []byte {
	b = append(b, o.limit.quotaText...)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, h.policyWindowOf(o), 10)
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

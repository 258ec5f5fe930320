package e2e

// The rate-limit fields as a client reads them: RateLimit and
// RateLimit-Policy parsed as RFC 9651 structured fields by a strict parser
// of the test's own, the X-RateLimit-* integers, and the checks every
// test makes of them.

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// intHeader reads a header that must hold an integer.
func intHeader(t *testing.T, r response, name string) int64 {
	t.Helper()
	v := r.header.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not an integer (status %d, headers %v)", name, v, r.code, r.header)
	}
	return n
}

// member is one zone's entry of RateLimit or RateLimit-Policy.
type member struct {
	zone   string
	params map[string]any
}

// fieldMembers parses a RateLimit or RateLimit-Policy field as an RFC 9651
// List of Strings with parameters, failing the test if it does not parse.
func fieldMembers(t *testing.T, r response, name string) []member {
	t.Helper()
	v := r.header.Values(name)
	if len(v) != 1 {
		t.Fatalf("%s: want one field line, got %q", name, v)
	}
	items, err := parseSFList(v[0])
	if err != nil {
		t.Fatalf("%s: %q does not parse as an RFC 9651 List: %v", name, v[0], err)
	}
	out := make([]member, len(items))
	for i, it := range items {
		s, ok := it.value.(string)
		if !ok {
			t.Fatalf("%s: member %d of %q is %T, want a String", name, i, v[0], it.value)
		}
		out[i] = member{zone: s, params: map[string]any{}}
		for _, p := range it.params {
			out[i].params[p.key] = p.value
		}
	}
	return out
}

// zoneParams is the parameters of zone's member of field, which must exist.
func zoneParams(t *testing.T, r response, field, zone string) map[string]any {
	t.Helper()
	for _, m := range fieldMembers(t, r, field) {
		if m.zone == zone {
			return m.params
		}
	}
	t.Fatalf("%s: no member for zone %q in %q", field, zone, r.header.Get(field))
	return nil
}

// intParam reads an Integer parameter.
func intParam(t *testing.T, params map[string]any, key string) int64 {
	t.Helper()
	n, ok := params[key].(int64)
	if !ok {
		t.Fatalf("parameter %s is %#v, want an Integer (params %v)", key, params[key], params)
	}
	return n
}

// wantRemaining checks what the headers say is left: X-RateLimit-Remaining
// and the zone's r in RateLimit.
func wantRemaining(t *testing.T, what string, rs []response, zone string, want ...int64) {
	t.Helper()
	for i, r := range rs {
		if got := intHeader(t, r, "X-RateLimit-Remaining"); got != want[i] {
			t.Errorf("%s: request %d: X-RateLimit-Remaining %d, want %d", what, i+1, got, want[i])
		}
		if got := intParam(t, zoneParams(t, r, "RateLimit", zone), "r"); got != want[i] {
			t.Errorf("%s: request %d: RateLimit r=%d, want %d", what, i+1, got, want[i])
		}
	}
}

// checkDenial checks the fields every 429 carries: Retry-After in whole
// seconds within [lo, hi], and the refusing zone's t equal to it.
func checkDenial(t *testing.T, r response, zone string, lo, hi int64) int64 {
	t.Helper()
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", r.code)
	}
	retry := intHeader(t, r, "Retry-After")
	if retry < 1 || retry < lo || retry > hi {
		t.Errorf("Retry-After %d, want within [%d, %d] and at least 1", retry, max(lo, 1), hi)
	}
	if tp := intParam(t, zoneParams(t, r, "RateLimit", zone), "t"); tp != retry {
		t.Errorf("RateLimit t=%d on a denial, want Retry-After %d", tp, retry)
	}
	if rem := intHeader(t, r, "X-RateLimit-Remaining"); rem != 0 {
		t.Errorf("X-RateLimit-Remaining %d on a denial, want 0", rem)
	}
	return retry
}

// policyQuota is q of zone's member of RateLimit-Policy, which must exist.
func policyQuota(t *testing.T, r response, zone string) int64 {
	t.Helper()
	return intParam(t, zoneParams(t, r, "RateLimit-Policy", zone), "q")
}

// checkPolicy checks RateLimit-Policy, and X-RateLimit-Limit against its q.
func checkPolicy(t *testing.T, rs []response, zone, want string) {
	t.Helper()
	for i, r := range rs {
		if got := r.header.Get("RateLimit-Policy"); got != want {
			t.Errorf("response %d: RateLimit-Policy %q, want %q", i+1, got, want)
		}
		if got, q := intHeader(t, r, "X-RateLimit-Limit"), policyQuota(t, r, zone); got != q {
			t.Errorf("response %d: X-RateLimit-Limit %d, want the policy's q=%d", i+1, got, q)
		}
	}
}

// wantRetryAbout checks that r's Retry-After points at about when (within
// 2 s either way: the response's own time is known to the second).
func wantRetryAbout(t *testing.T, r response, when time.Time, what string) {
	t.Helper()
	want := int64(math.Ceil(when.Sub(r.done).Seconds()))
	if got := intHeader(t, r, "Retry-After"); got < want-2 || got > want+2 {
		t.Errorf("Retry-After %d, want about %d (%s)", got, want, what)
	}
}

// wantResetWithin checks that X-RateLimit-Reset, an epoch second rounded
// up, lies between lo and hi after the response.
func wantResetWithin(t *testing.T, r response, lo, hi time.Duration) {
	t.Helper()
	reset := intHeader(t, r, "X-RateLimit-Reset")
	at := r.done.Unix()
	if reset < at+int64(lo.Seconds()) || reset > at+int64(hi.Seconds())+1 {
		t.Errorf("X-RateLimit-Reset %d is %ds after the response, want %v to %v", reset, reset-at, lo, hi)
	}
}

// sfParam is one parameter of a structured-field Item.
type sfParam struct {
	key   string
	value any
}

// sfItem is a structured-field Item: a bare value (string for String and
// Token, int64 for Integer, float64 for Decimal, bool for Boolean) with its
// parameters.
type sfItem struct {
	value  any
	params []sfParam
}

// parseSFList parses an RFC 9651 List whose members are Items (inner
// lists and byte sequences are not used by the rate-limit fields and are
// refused). It is strict, so a field it accepts parses anywhere.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skip(" ")
	var out []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skip(" \t")
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' between members, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skip(" \t")
		if p.i == len(p.s) {
			return nil, errors.New("trailing comma")
		}
	}
	return out, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) skip(chars string) {
	for p.i < len(p.s) && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var pv any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if pv, err = p.bareItem(); err != nil {
				return sfItem{}, err
			}
		}
		for _, q := range it.params {
			if q.key == key {
				return sfItem{}, fmt.Errorf("parameter %s repeated", key)
			}
		}
		it.params = append(it.params, sfParam{key, pv})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: a key starts with a lowercase letter or '*'", p.i)
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || strings.IndexByte("_-.*", c) >= 0) {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.i >= len(p.s) {
		return nil, errors.New("unexpected end, want a value")
	}
	switch c := p.s[p.i]; {
	case c == '"':
		return p.str()
	case c == '-' || isDigit(c):
		return p.number()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("at %d: malformed Boolean", p.i)
	case c == '*' || isAlpha(c):
		start := p.i
		p.i++
		for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return p.s[start:p.i], nil
	default:
		return nil, fmt.Errorf("at %d: unsupported or malformed value starting %q", p.i, c)
	}
}

func (p *sfParser) str() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", fmt.Errorf("at %d: a backslash in a String must escape '\"' or '\\'", p.i)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("at %d: byte %#x not allowed in a String", p.i-1, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("unterminated String")
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits, dot := 0, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			if digits > 12 {
				return nil, errors.New("Decimal with more than 12 integer digits")
			}
			dot = p.i
		} else if !isDigit(c) {
			break
		}
		if c != '.' {
			digits++
		}
		p.i++
	}
	text := p.s[start:p.i]
	if digits == 0 {
		return nil, fmt.Errorf("at %d: malformed number", start)
	}
	if dot < 0 {
		if digits > 15 {
			return nil, errors.New("Integer with more than 15 digits")
		}
		return strconv.ParseInt(text, 10, 64)
	}
	if frac := p.i - dot - 1; frac < 1 || frac > 3 {
		return nil, errors.New("Decimal needs 1 to 3 fractional digits")
	}
	return strconv.ParseFloat(text, 64)
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }

// isTChar is RFC 9110's tchar.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// TestSFParser checks the test's own parser against RFC 9651 examples, so
// a failure above is the handler's and not the parser's.
func TestSFParser(t *testing.T) {
	t.Parallel()
	items, err := parseSFList(`"a\"b\\c";q=20;w=12, tok;qu="concurrent-requests";x, "z";r=-3;d=1.5;b=?0`)
	if err != nil {
		t.Fatal(err)
	}
	want := []sfItem{
		{`a"b\c`, []sfParam{{"q", int64(20)}, {"w", int64(12)}}},
		{"tok", []sfParam{{"qu", "concurrent-requests"}, {"x", true}}},
		{"z", []sfParam{{"r", int64(-3)}, {"d", 1.5}, {"b", false}}},
	}
	if fmt.Sprint(items) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", items, want)
	}
	for _, bad := range []string{`"a`, `"a\x"`, `"a";Q=1`, `"a",`, `"a" "b"`, `"a";q=1.2345`, `"a";q=1234567890123456`, "\"\x01\""} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}

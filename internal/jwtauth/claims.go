package jwtauth

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// Claims are the claims of a verified token, decoded with numbers kept as
// json.Number so large identifiers survive exactly. A Verifier shares one
// map between every request bearing the same token, so it must not be
// modified.
type Claims map[string]any

// Lookup returns the claim at path rendered as a rate-limit key, so that
// the same identity always yields the same bucket whatever the issuer's
// JSON encoder did with it. Dots in path reach into nested objects
// (org.id); a top-level claim whose name itself contains dots (a namespaced
// claim such as https://example.com/org) is matched whole first. Strings
// are returned as they are, numbers in plain decimal without exponent or
// trailing zeros (integral values as integers), booleans as true or false.
// Objects, arrays, null and missing claims give ok=false: none of them
// names one client.
func (c Claims) Lookup(path string) (string, bool) {
	if c == nil || path == "" {
		return "", false
	}
	val, found := c[path]
	if !found {
		var cur any = map[string]any(c)
		for rest, more := path, true; more; {
			var seg string
			seg, rest, more = strings.Cut(rest, ".")
			if seg == "" {
				return "", false
			}
			var m map[string]any
			switch x := cur.(type) {
			case map[string]any:
				m = x
			case jwt.MapClaims:
				m = x
			case Claims:
				m = x
			default:
				return "", false
			}
			if cur, found = m[seg]; !found {
				return "", false
			}
		}
		val = cur
	}
	return renderClaim(val)
}

// renderClaim renders a scalar claim value as a key string.
func renderClaim(val any) (string, bool) {
	switch x := val.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case json.Number:
		return renderDecimal(string(x))
	case float64:
		return renderFloat(x, 64)
	case float32:
		return renderFloat(float64(x), 32)
	case int:
		return strconv.Itoa(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case uint32:
		return strconv.FormatUint(uint64(x), 10), true
	case uint:
		return strconv.FormatUint(uint64(x), 10), true
	}
	return "", false
}

// renderFloat renders f in plain decimal; NaN and infinities name no one.
func renderFloat(f float64, bits int) (string, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", false
	}
	if f == 0 {
		return "0", true // also -0
	}
	return strconv.FormatFloat(f, 'f', -1, bits), true
}

// renderMaxPadding bounds the zeros an exponent may add when a number is
// written out in plain decimal (1e400 would otherwise be 401 characters);
// beyond it the number is not usable as a key.
const renderMaxPadding = 400

// renderDecimal rewrites a JSON number literal exactly in plain decimal:
// no exponent, no leading or trailing zeros, "-" only for non-zero values.
// Digits are never lost, so 12345678901234567890 stays as it is.
func renderDecimal(s string) (string, bool) {
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	i, neg := 0, false
	if i < len(s) && s[i] == '-' {
		neg, i = true, i+1
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[start:i]
	if intPart == "" {
		return "", false
	}
	var frac string
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if frac = s[start:i]; frac == "" {
			return "", false
		}
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg, i = s[i] == '-', i+1
		}
		start = i
		for ; i < len(s) && isDigit(s[i]); i++ {
			if exp < 1e9 {
				exp = exp*10 + int(s[i]-'0')
			}
		}
		if start == i {
			return "", false
		}
		if expNeg {
			exp = -exp
		}
	}
	if i != len(s) {
		return "", false
	}

	// digits with the decimal point after point digits (point may be
	// negative or beyond the digits).
	digits := intPart + frac
	point := len(intPart) + exp
	lead := len(digits) - len(strings.TrimLeft(digits, "0"))
	digits, point = digits[lead:], point-lead
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return "0", true
	}
	if point > len(digits)+renderMaxPadding || point < -renderMaxPadding {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(digits) + renderMaxPadding/8 + 3)
	if neg {
		b.WriteByte('-')
	}
	switch {
	case point <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(digits)
	case point >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", point-len(digits)))
	default:
		b.WriteString(digits[:point])
		b.WriteByte('.')
		b.WriteString(digits[point:])
	}
	return b.String(), true
}

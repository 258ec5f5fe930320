package jwtauth

import (
	"net/http"
	"net/url"
	"strings"
)

// maxTokenLen bounds the token considered; real tokens are a few KiB, and a
// larger one is treated as no token without being parsed.
const maxTokenLen = 16 << 10

// extract returns the raw token from the configured place, or "".
func (v *Verifier) extract(r *http.Request) string {
	var val string
	switch v.place {
	case Header:
		val = r.Header.Get(v.name)
		if scheme, rest, found := strings.Cut(val, " "); found && strings.EqualFold(scheme, "Bearer") {
			val = rest
		} else if v.requireBearer {
			return ""
		}
	case Cookie:
		c, err := r.Cookie(v.name)
		if err != nil {
			return ""
		}
		val = c.Value
	case Query:
		if r.URL == nil {
			return ""
		}
		val = queryValue(r.URL.RawQuery, v.name)
	}
	return strings.TrimSpace(val)
}

// queryValue returns the first value of the query parameter name, as
// url.Values.Get would, without building the whole map on every request.
func queryValue(rawQuery, name string) string {
	for rest := rawQuery; rest != ""; {
		var pair string
		pair, rest, _ = strings.Cut(rest, "&")
		if strings.Contains(pair, ";") {
			continue // refused by url.ParseQuery too
		}
		key, val, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(key, "%+") {
			var err error
			if key, err = url.QueryUnescape(key); err != nil {
				continue
			}
		}
		if key != name {
			continue
		}
		if strings.ContainsAny(val, "%+") {
			unescaped, err := url.QueryUnescape(val)
			if err != nil {
				continue
			}
			val = unescaped
		}
		return val
	}
	return ""
}

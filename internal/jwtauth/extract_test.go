package jwtauth

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgatehq/caddy-ratelimit/internal/jwttest"
)

func TestJWTTokenSources(t *testing.T) {
	k := jwttest.TestKeys(t)
	tok := jwttest.Sign(t, jwt.SigningMethodHS256, k.HMAC, "", jwttest.ClaimsAt(time.Now(), nil))
	cases := []struct {
		what  string
		place Place
		from  string
		req   func() *http.Request
		ok    bool
	}{
		{"default bearer", Header, "", func() *http.Request { return jwttest.Bearer(tok) }, true},
		{"default bearer, lower-case scheme", Header, "", withHeader("Authorization", "bearer   "+tok), true},
		{"default without the Bearer scheme", Header, "", withHeader("Authorization", tok), false},
		{"default with the Basic scheme", Header, "", func() *http.Request {
			r := jwttest.Bearer("")
			r.SetBasicAuth("user", "pass")
			return r
		}, false},
		{"no token", Header, "", func() *http.Request { return jwttest.Bearer("") }, false},
		{"header", Header, "x-api-token", withHeader("X-Api-Token", tok), true},
		{"header with a Bearer prefix", Header, "X-Api-Token", withHeader("X-Api-Token", "Bearer "+tok), true},
		{"header source ignores Authorization", Header, "X-Api-Token", func() *http.Request { return jwttest.Bearer(tok) }, false},
		{"cookie", Cookie, "session", func() *http.Request {
			r := jwttest.Bearer("")
			r.AddCookie(&http.Cookie{Name: "other", Value: "x"})
			r.AddCookie(&http.Cookie{Name: "session", Value: tok})
			return r
		}, true},
		{"cookie missing", Cookie, "session", func() *http.Request { return jwttest.Bearer(tok) }, false},
		{"query", Query, "access_token", func() *http.Request {
			return httptest.NewRequest(http.MethodGet, "http://example.test/p?a=1&access_token="+tok, nil)
		}, true},
		{"query missing", Query, "access_token", func() *http.Request {
			return httptest.NewRequest(http.MethodGet, "http://example.test/p?token="+tok, nil)
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.what, func(t *testing.T) {
			v := newVerifier(t, Options{Secret: k.HMAC, Place: tc.place, Name: tc.from})
			c, ok := v.Claims(tc.req())
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && c["sub"] != "user-1" {
				t.Errorf("claims = %v", c)
			}
		})
	}
	var nilV *Verifier
	if _, ok := nilV.Claims(jwttest.Bearer(tok)); ok {
		t.Error("nil verifier accepted a token")
	}
	nilV.Close()
}

func TestQueryValueMatchesURLValues(t *testing.T) {
	for _, q := range []string{
		"", "t=a", "a=1&t=b&t=c", "t", "t=", "x=1;t=2&t=3", "t%3D=1&t=2", "%74=esc", "t=a%2Bb+c",
		"t=%zz&t=ok", "%zz=1&t=ok", "&&t=x&&", "tt=1&t=2", "t=a=b",
	} {
		want := ""
		if vals, _ := url.ParseQuery(q); len(vals["t"]) > 0 {
			want = vals["t"][0]
		}
		if got := queryValue(q, "t"); got != want {
			t.Errorf("queryValue(%q) = %q, url.Values gives %q", q, got, want)
		}
	}
}

// withHeader makes a request with no token but header name set to value.
func withHeader(name, value string) func() *http.Request {
	return func() *http.Request {
		r := jwttest.Bearer("")
		r.Header.Set(name, value)
		return r
	}
}

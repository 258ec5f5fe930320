package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The fuzz targets of the request path and of the admin API's override
// bodies. Their seed corpora run as ordinary tests; docs/testing.md
// ("Fuzzing") says how to fuzz longer. Each checks invariants a client or operator
// relies on, not only the absence of a panic.

// fuzzHandler provisions one handler of config for a fuzz target, once:
// the target's runs share it, as a server's requests do.
type fuzzHandler struct {
	once sync.Once
	h    *Handler
}

func (f *fuzzHandler) get(t *testing.T, config string) *Handler {
	f.once.Do(func() {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(config))
		if err == nil {
			ctx, _ := caddy.NewContext(caddy.Context{Context: context.Background()})
			err = h.Provision(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		f.h = h
	})
	if f.h == nil {
		t.Skip("the fuzz handler failed to provision")
	}
	return f.h
}

// fuzzPath is the handler the request-path target drives: a key from a
// header, a cost from a header, count_response and response_cost zones.
var fuzzPath fuzzHandler

const fuzzPathConfig = `rate_limit {
	zone fz_cost {
		key {http.request.header.X-Key}
		missing_key ip
		algorithm fixed_window
		rate 50/1h
		cost {http.request.header.X-Cost}
		count_response {
			status 401
		}
	}
	zone fz_tokens {
		key ip
		ipv4_prefix 24
		ipv6_prefix 48
		algorithm token_bucket
		rate 1000/1h
		response_cost X-Tokens
	}
	zone fz_conc {
		key {http.request.header.X-Key}
		missing_key skip
		algorithm concurrency
		events 3
		cost {http.request.header.X-Cost}
	}
}`

// FuzzRequestPath sends one request of a client-chosen IP, key, cost and
// upstream answer through a provisioned handler. Whatever the input: no
// panic; the answer is the upstream's, a 400 (a bad cost) or a 429 with a
// whole Retry-After; the remaining count is a whole number within the
// limit; the upstream's response_cost field never reaches the client; and
// the client's key never appears in a response field.
func FuzzRequestPath(f *testing.F) {
	f.Add("203.0.113.7", "alice", "1", "401", "12")
	f.Add("2001:db8::1", "", "0", "200", "")
	f.Add("bogus", "k\x00\xff", "-1", "500", "-3")
	f.Add("::ffff:10.0.0.1", "bob", "51", "200", "99999999999999999999")
	f.Add("203.0.113.7", "carol", "3", "200", " 7 ")
	f.Add("", "dave", "nope", "999", "0x10")
	f.Fuzz(func(t *testing.T, ip, key, cost, status, tokens string) {
		h := fuzzPath.get(t, fuzzPathConfig)
		code, err := strconv.Atoi(status)
		if err != nil || code < 200 || code > 599 {
			code = 200
		}
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("X-Tokens", tokens)
			w.WriteHeader(code)
			return nil
		})
		headers := map[string]string{"X-Key": key, "X-Cost": cost}
		r, _ := newKeyRequest(ip, headers)
		w := httptest.NewRecorder()
		err = h.ServeHTTP(w, r, next)
		got := w.Code
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			got = he.StatusCode
		} else if err != nil {
			t.Fatalf("error %v", err)
		}
		switch {
		case got == code:
		case got == http.StatusBadRequest, got == http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d, want %d (the upstream's), 400 or 429", got, code)
		}
		hdr := w.Header()
		if got == http.StatusTooManyRequests {
			if n, err := strconv.Atoi(hdr.Get(hdrRetryAfter)); err != nil || n < 1 {
				t.Fatalf("429 with Retry-After %q", hdr.Get(hdrRetryAfter))
			}
		}
		if v := hdr.Get(hdrRemaining); v != "" {
			rem, err1 := strconv.ParseInt(v, 10, 64)
			lim, err2 := strconv.ParseInt(hdr.Get(hdrLimit), 10, 64)
			if err1 != nil || err2 != nil || rem < 0 || rem > lim {
				t.Fatalf("remaining %q of limit %q", v, hdr.Get(hdrLimit))
			}
		}
		if v := hdr.Get("X-Tokens"); v != "" && got == code {
			t.Fatalf("the upstream's X-Tokens %q reached the client", v)
		}
		if len(key) >= 4 {
			for name, vals := range hdr {
				for _, v := range vals {
					if strings.Contains(v, key) {
						t.Fatalf("field %s carries the client's key: %q", name, v)
					}
				}
			}
		}
	})
}

// FuzzOverrideBody PUTs a client of the admin API's body as a key's
// override: the answer is 200 or 400, never a 5xx or a panic, and after a
// 200 the key's next request is decided (upstream's 200 or a 429).
func FuzzOverrideBody(f *testing.F) {
	f.Add(`{"limit":2}`)
	f.Add(`{"limit":2,"window":"1h","burst":3,"expires":"10m"}`)
	f.Add(`{"action":"block","expires":"2026-12-01T00:00:00Z"}`)
	f.Add(`{"action":"exempt"}`)
	f.Add(`{"limit":9223372036854775807,"window":"1ns"}`)
	f.Add(`{"limit":1} {"limit":2}`)
	f.Add(`{"limit":-1,"window":"-1h"}`)
	f.Add(`{"action":"limit","limit":1,"window":"month"}`)
	f.Fuzz(func(t *testing.T, body string) {
		h := fuzzOverride.get(t, "rate_limit {\n zone fz_ov {\n  key ip\n  algorithm token_bucket\n  rate 10/1m\n }\n}")
		const key = "198.51.100.200"
		code, msg := adminOverride(t, http.MethodPut, "fz_ov", key, body)
		defer adminOverride(t, http.MethodDelete, "fz_ov", key, "")
		switch code {
		case http.StatusOK:
		case http.StatusBadRequest:
			return
		default:
			t.Fatalf("PUT %q answered %d: %s", body, code, msg)
		}
		r, _ := newKeyRequest(key, nil)
		if _, got := serve(h, r, okHandler); got != http.StatusOK && got != http.StatusTooManyRequests {
			t.Fatalf("after PUT %q, the key's request got %d", body, got)
		}
	})
}

// fuzzOverride is the handler the override-body target drives.
var fuzzOverride fuzzHandler

// FuzzRedisBlockSecret: a redis block whose password, sentinel password
// or URL userinfo holds a literal part beside a placeholder left unset is
// refused without that literal part in the error.
func FuzzRedisBlockSecret(f *testing.F) {
	f.Add("hunter2-literal")
	f.Add("S3cretPassw0rd")
	f.Add("p{a}ss")
	f.Fuzz(func(t *testing.T, secret string) {
		if len(secret) < 6 || strings.ContainsAny(secret, "{}\\\"'@:/ \t\r\n#`") {
			return
		}
		for _, block := range []string{
			"addresses 127.0.0.1:6379\npassword " + secret + "{env.FLOODGATE_TEST_UNSET}",
			"addresses 127.0.0.1:6379\nmaster_name m\nsentinel_password {env.FLOODGATE_TEST_UNSET}" + secret,
			"url redis://user:" + secret + "@{env.FLOODGATE_TEST_UNSET}:6379/0",
		} {
			d, ok := fuzzDispenser("rate_limit {\nzone z {\nrate 1/s\nstore redis\n}\nredis {\n" + block + "\n}\n}")
			if !ok {
				continue
			}
			h := new(Handler)
			if err := h.UnmarshalCaddyfile(d); err != nil {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("parse error shows the secret: %v", err)
				}
				continue
			}
			err := h.Redis.checkResolved()
			if err == nil {
				t.Fatalf("%q accepted with its placeholder unset", block)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("refusal shows the secret: %v", err)
			}
		}
	})
}

// fuzzDispenser tokenizes input as Caddy does when it loads a Caddyfile,
// reporting false for text Caddy refuses before any directive sees it
// (caddyfile.NewTestDispenser ends the process on such text instead).
func fuzzDispenser(input string) (*caddyfile.Dispenser, bool) {
	tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
	if err != nil {
		return nil, false
	}
	return caddyfile.NewDispenser(tokens), true
}

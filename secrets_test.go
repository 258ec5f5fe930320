package ratelimit

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestRedisSecretsNeverInErrors: a redis block refused because a
// placeholder resolves to nothing names the field and its placeholders,
// never a literal password: not the URL's userinfo, nor a `password` or
// `sentinel_password` with a literal part. (The refusal quoted the whole
// value: "redis://floodgate:S3cretPassw0rd@{env.UNSET}:6379/0" in the
// log, on stderr and in the admin API's /load answer.)
func TestRedisSecretsNeverInErrors(t *testing.T) {
	cases := []struct {
		block, secret, want string
	}{
		{"url redis://floodgate:S3cretPassw0rd@{env.FLOODGATE_TEST_UNSET}:6379/0", "S3cretPassw0rd", "{env.FLOODGATE_TEST_UNSET}"},
		{"url rediss://:S3cretPassw0rd@{env.FLOODGATE_TEST_UNSET}", "S3cretPassw0rd", "{env.FLOODGATE_TEST_UNSET}"},
		{"addresses 127.0.0.1:6379\npassword hunter2-literal{env.FLOODGATE_TEST_UNSET}", "hunter2", "password"},
		{"addresses 127.0.0.1:6379\nmaster_name mymaster\nsentinel_password {env.FLOODGATE_TEST_UNSET}hunter2", "hunter2", "sentinel_password"},
	}
	for _, tc := range cases {
		_, h := adaptRedisBlock(t, tc.block)
		err := h.Redis.checkResolved()
		if err == nil {
			t.Errorf("%q: accepted with its placeholder unset", tc.block)
			continue
		}
		if strings.Contains(err.Error(), tc.secret) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: refused with %q: want it to name %s and not show %s", tc.block, err, tc.want, tc.secret)
		}
	}
}

func TestRedactSecret(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"password", "hunter2{env.A}", "***{env.A}"},
		{"password", "{env.A}hunter2{env.B}x", "{env.A}***{env.B}***"},
		{"password", "{env.A}", "{env.A}"},
		{"password", "open{brace", "***"},
		{"url", "redis://u:p@{env.H}:6379/0", "redis://u:***@{env.H}:6379/0"},
		{"url", "redis://u@{env.H}/0", "redis://u@{env.H}/0"},
		{"url", "redis://{env.H}/0?x=a@b", "redis://{env.H}/0?x=a@b"},
		{"master_name", "m{env.A}", "m{env.A}"},
	} {
		if got := redactSecret(tc.name, tc.in); got != tc.want {
			t.Errorf("redactSecret(%s, %q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestKeySecretNamesKeysByHMAC: with key_secret a key is named by the
// HMAC-SHA256 of the secret in decision samples and the admin API's top
// (the same name as in Redis key names, limiter.TestKeyHasher), so an
// IPv4 address cannot be recovered by hashing the address space; a
// secret shorter than 16 bytes, or a placeholder left unset, refuses the
// config without showing it.
func TestKeySecretNamesKeysByHMAC(t *testing.T) {
	const secret = "0123456789abcdef-key-secret"
	h := provisionHandler(t, `rate_limit {
		key_secret `+secret+`
		log_sample 1
		zone keyed_names {
			key ip
			rate 10/1h
		}
	}`)
	core, logs := observer.New(zapcore.InfoLevel)
	h.useLogger(zap.New(core))
	const ip = "203.0.113.7"
	r, _ := newKeyRequest(ip, nil)
	serve(h, r, okHandler)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ip))
	want := hex.EncodeToString(mac.Sum(nil)[:16])
	entries := logs.FilterMessage("rate limit decision").All()
	if len(entries) != 1 || entries[0].ContextMap()["key_hash"] != want {
		t.Fatalf("sampled decisions %v, want one with key_hash %s", entries, want)
	}
	w := httptest.NewRecorder()
	if err := serveAdmin(w, httptest.NewRequest(http.MethodGet, adminPrefix+"zones/keyed_names/top", nil)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.Body.String(), `"key":"`+want+`"`) {
		t.Fatalf("top %s, want the key named %s", w.Body, want)
	}

	for _, bad := range []string{"key_secret short-secret", "key_secret s3cr3t-literal-part{env.FLOODGATE_TEST_UNSET}"} {
		hh := new(Handler)
		if err := hh.UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\n" + bad + "\nzone z {\nrate 1/1s\n}\n}")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := hh.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "key_secret") || strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "short-secret") {
			t.Errorf("%s: provisioned with %v; want key_secret refused without showing it", bad, err)
		}
	}
}

// BenchmarkHandlerKeySecret is what key_secret costs a decision whose key
// is named: every decision is sampled (log_sample 1, to a logger that
// writes nothing), so each names its key once, as a Redis call does, by
// SHA-256 without a secret and by HMAC-SHA256 with one.
func BenchmarkHandlerKeySecret(b *testing.B) {
	for _, bc := range []struct{ name, option string }{
		{"sha256", ""},
		{"key_secret", "key_secret 0123456789abcdef-bench-secret\n"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := provisionHandler(b, "rate_limit {\n"+bc.option+" log_sample 1\n zone ks_"+bc.name+" {\n  key ip\n  algorithm token_bucket\n  rate 1000000000/1s\n }\n}")
			h.useLogger(zap.NewNop())
			r, _ := newKeyRequest("198.51.100.9", nil)
			benchServeFresh(b, h, []*http.Request{r})
		})
	}
}

package ratelimit

import (
	"strings"
	"testing"
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

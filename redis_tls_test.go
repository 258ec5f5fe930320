package ratelimit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"go.uber.org/zap"
)

// TestCaddyfileRedisTLS: the tls block's options adapt to their JSON
// fields and reach the client settings; the bare tls and tls
// insecure_skip_verify keep their meaning, and insecure_skip_verify may
// also stand in the block.
func TestCaddyfileRedisTLS(t *testing.T) {
	for _, tc := range []struct {
		name, tls string
		want      RedisConfig
	}{
		{"bare", "tls", RedisConfig{TLS: true}},
		{"insecure", "tls insecure_skip_verify", RedisConfig{TLS: true, InsecureSkipVerify: true}},
		{"block", "tls {\n ca /etc/redis/ca.pem\n cert /etc/redis/client.pem\n key /etc/redis/client-key.pem\n server_name redis.internal\n}",
			RedisConfig{TLS: true, TLSCA: "/etc/redis/ca.pem", TLSCert: "/etc/redis/client.pem", TLSKey: "/etc/redis/client-key.pem", TLSServerName: "redis.internal"}},
		{"insecure in the block", "tls {\n insecure_skip_verify\n cert c.pem\n key k.pem\n}", RedisConfig{TLS: true, InsecureSkipVerify: true, TLSCert: "c.pem", TLSKey: "k.pem"}},
		{"insecure before the block", "tls insecure_skip_verify {\n server_name redis.internal\n}", RedisConfig{TLS: true, InsecureSkipVerify: true, TLSServerName: "redis.internal"}},
		{"empty block", "tls {\n}", RedisConfig{TLS: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := adaptRedisBlock(t, "addresses 10.0.0.1:6380\n"+tc.tls)
			var got *RedisConfig
			for _, rt := range adaptedRoutes(t, out) {
				for _, raw := range rt.Handle {
					var h struct {
						Redis *RedisConfig `json:"redis"`
					}
					if err := json.Unmarshal(raw, &h); err != nil {
						t.Fatal(err)
					}
					if h.Redis != nil {
						got = h.Redis
					}
				}
			}
			if got == nil {
				t.Fatalf("no redis block in %s", out)
			}
			want := tc.want
			want.Addresses = []string{"10.0.0.1:6380"}
			if fmt.Sprint(*got) != fmt.Sprint(want) {
				t.Errorf("adapted %+v, want %+v (JSON %s)", *got, want, out)
			}
			key := got.poolKey().Client
			if key.TLSOptions != (redisstore.TLS{CAFile: want.TLSCA, CertFile: want.TLSCert, KeyFile: want.TLSKey, ServerName: want.TLSServerName}) {
				t.Errorf("client settings %+v", key.TLSOptions)
			}
		})
	}
	// tls takes no other argument, also before a block.
	for _, bad := range []string{"tls yes", "tls insecure_skip_verify please", "tls on {\n}"} {
		_, err := parseDirective(t, "rate_limit {\n\tzone a {\n\t\trate 5/s\n\t\tstore redis\n\t}\n\tredis {\n\t\taddresses 10.0.0.1:6380\n\t\t"+bad+"\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), "redis: option 'tls' takes [insecure_skip_verify] [{ ... }]") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestRedisTLSJSON: in JSON the tls block is tls_ca, tls_cert, tls_key
// and tls_server_name beside tls; a pair half given, or a ca that
// insecure_skip_verify would ignore, is refused when the config loads
// (validate), and so is a file that cannot be read or holds no
// certificate (Provision, which builds the client), naming the file.
func TestRedisTLSJSON(t *testing.T) {
	var c RedisConfig
	if err := json.Unmarshal([]byte(`{"addresses":["h:1"],"tls":true,"tls_ca":"ca.pem","tls_cert":"c.pem","tls_key":"k.pem","tls_server_name":"n"}`), &c); err != nil {
		t.Fatal(err)
	}
	if c.TLSCA != "ca.pem" || c.TLSCert != "c.pem" || c.TLSKey != "k.pem" || c.TLSServerName != "n" {
		t.Fatalf("decoded %+v", c)
	}
	for _, bad := range []RedisConfig{
		{Addresses: []string{"h:1"}, TLS: true, TLSCert: "c.pem"},
		{Addresses: []string{"h:1"}, TLS: true, TLSKey: "k.pem"},
		{Addresses: []string{"h:1"}, TLS: true, TLSCA: "ca.pem", InsecureSkipVerify: true},
	} {
		if err := bad.validate(); err == nil || !strings.HasPrefix(err.Error(), "tls: ") {
			t.Errorf("%+v: validate %v, want a tls refusal", bad, err)
		}
	}
	missing := filepath.Join(t.TempDir(), "ca.pem")
	_, _, err := loadRedisClient((&RedisConfig{Addresses: []string{"127.0.0.1:1"}, TLS: true, TLSCA: missing}).poolKey(), zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("loading a client whose ca is missing: %v, want an error naming %s", err, missing)
	}
}

// TestRedisPoolKeyFollowsTLSFiles: a client certificate renewed in place,
// under the same file name, changes the pool key, so the reload that
// follows connects with it instead of sharing the old client.
func TestRedisPoolKeyFollowsTLSFiles(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	write := func(path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(cert, "one")
	write(key, "one")
	c := &RedisConfig{Addresses: []string{"h:1"}, TLS: true, TLSCert: cert, TLSKey: key}
	mk := func() string {
		raw, err := json.Marshal(c.poolKey())
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	before := mk()
	if again := mk(); again != before {
		t.Fatal("the same files give two pool keys")
	}
	write(cert, "two")
	if mk() == before {
		t.Error("a renewed certificate keeps the pool key: a reload would keep presenting the old one")
	}
	if strings.Contains(mk(), "two") {
		t.Error("the pool key holds a file's content")
	}
}

// TestRedisConfigFixTLS: the warm start names the fix of each TLS failure
// that is the tls block's or its certificates', from the errors crypto/tls
// gives (its own checks) or the alerts the server sends (the server's);
// wrapped, as the store's errors are.
func TestRedisConfigFixTLS(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("redis store for zone %q: %w", "z", err) }
	remote := func(text string) error { return &net.OpError{Op: "remote error", Err: errors.New(text)} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, "not signed by the tls block's ca"},
		{&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "10.0.0.1"}}, "server_name"},
		{&tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}, "server's certificate has expired"},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "does not speak TLS"},
		{remote("tls: certificate required"), "requires a client certificate: set the tls block's cert and key"},
		{remote("tls: expired certificate"), "client certificate as expired"},
		{remote("tls: unknown certificate authority"), "signed by a CA in the server's tls-ca-cert-file"},
	} {
		if got := redisConfigFix(wrap(tc.err)); !strings.Contains(got, tc.want) {
			t.Errorf("%v: fix %q, want one saying %q", tc.err, got, tc.want)
		}
	}
	for _, other := range []error{errors.New("i/o timeout"), remote("tls: internal error"), &net.OpError{Op: "dial", Err: errors.New("connection refused")}} {
		if got := redisConfigFix(wrap(other)); got != "" {
			t.Errorf("%v: fix %q, want none: waiting may mend it", other, got)
		}
	}
}

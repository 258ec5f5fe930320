package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisTLSOptions: the tls block's CA, client certificate and server
// name reach go-redis's tls.Config, with a bare tls and with a rediss://
// url alike, whose host the server name then replaces.
func TestRedisTLSOptions(t *testing.T) {
	ca := testpki.NewCA(t, "options")
	client := ca.Client(t, "floodgate")
	o := TLS{CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile, ServerName: "redis.internal"}
	for _, c := range []Config{
		{Addresses: []string{"10.0.0.1:6380"}, TLS: true, TLSOptions: o},
		{URL: "rediss://cache.example:6380", TLSOptions: o},
		{Addresses: []string{"a:1", "b:2", "c:3"}, TLS: true, TLSOptions: o},
		{Addresses: []string{"s:26379"}, MasterName: "m", TLS: true, TLSOptions: o},
	} {
		opts, err := c.options()
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		tc := opts.TLSConfig
		if tc == nil || tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "redis.internal" || tc.MinVersion < 0x0303 || tc.InsecureSkipVerify {
			t.Errorf("%+v: tls config %+v", c, tc)
		}
	}
	// Without a block: the system's CAs, no client certificate, the
	// dialled host's name.
	opts, err := Config{URL: "rediss://cache.example"}.options()
	if err != nil || opts.TLSConfig.RootCAs != nil || len(opts.TLSConfig.Certificates) != 0 || opts.TLSConfig.ServerName != "cache.example" {
		t.Errorf("rediss:// alone: %+v, %v", opts.TLSConfig, err)
	}
}

// TestRedisTLSRefusals: a tls block that contradicts itself is refused by
// Validate; a file that cannot be read or holds no certificate, or a key
// that is not the certificate's, by NewClient, naming the file and never
// quoting what a key file holds.
func TestRedisTLSRefusals(t *testing.T) {
	ca := testpki.NewCA(t, "refusals")
	client, other := ca.Client(t, "floodgate"), ca.Client(t, "other")
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("SECRET-KEY-MATERIAL not a PEM file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	base := Config{Addresses: []string{"127.0.0.1:6379"}, TLS: true}
	with := func(o TLS) Config { c := base; c.TLSOptions = o; return c }
	for _, tt := range []struct {
		name     string
		cfg      Config
		validate bool // refused by Validate, not only by NewClient
		want     []string
	}{
		{"cert without key", with(TLS{CertFile: client.CertFile}), true, []string{"tls: cert needs key"}},
		{"key without cert", with(TLS{KeyFile: client.KeyFile}), true, []string{"tls: key needs cert"}},
		{"ca with insecure_skip_verify", func() Config { c := with(TLS{CAFile: ca.CertFile}); c.InsecureSkipVerify = true; return c }(), true,
			[]string{"ca and insecure_skip_verify"}},
		{"no tls", Config{Addresses: base.Addresses, TLSOptions: TLS{CAFile: ca.CertFile}}, false, []string{"need tls or a rediss:// url"}},
		{"redis:// url", Config{URL: "redis://127.0.0.1", TLSOptions: TLS{ServerName: "x"}}, false, []string{"need tls or a rediss:// url"}},
		{"missing ca", with(TLS{CAFile: missing}), false, []string{"tls ca", missing, "no such file"}},
		{"ca without a certificate", with(TLS{CAFile: garbage}), false, []string{"tls ca " + garbage, "no PEM certificate"}},
		{"missing cert", with(TLS{CertFile: missing, KeyFile: client.KeyFile}), false, []string{"tls cert", missing}},
		{"missing key", with(TLS{CertFile: client.CertFile, KeyFile: missing}), false, []string{"tls key", missing}},
		{"garbage key", with(TLS{CertFile: client.CertFile, KeyFile: garbage}), false, []string{client.CertFile, garbage}},
		{"another certificate's key", with(TLS{CertFile: client.CertFile, KeyFile: other.KeyFile}), false, []string{client.CertFile, other.KeyFile, "does not match"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err != nil) != tt.validate {
				t.Errorf("Validate: %v, want refused=%v", err, tt.validate)
			}
			_, err := tt.cfg.NewClient()
			if err == nil {
				t.Fatal("NewClient accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error %q quotes a file's content", err)
			}
		})
	}
}

// TestRedisOverTLS: through servers that serve TLS only and require a
// client certificate, a standalone one and a Cluster (cluster bus over
// TLS too), the store does all it does on plain TCP; and a client that
// trusts another CA, shows no certificate, an expired one or one of
// another CA gets errors that say so, from a server that still answers
// a right client.
func TestRedisOverTLS(t *testing.T) {
	ca := testpki.NewCA(t, "redis")
	good := ca.Client(t, "floodgate")
	harness := redistest.TLS{CA: ca, Client: ca.Client(t, "harness")}
	ok := TLS{CAFile: ca.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile}
	ctx := context.Background()

	standalone := redistest.StartTLS(t, harness)
	cluster := redistest.StartClusterTLS(t, 3, harness)
	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{"standalone", []string{standalone.Addr()}},
		{"cluster", cluster.Addrs()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := Config{Addresses: tc.addrs, TLS: true, TLSOptions: ok}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			if err := exerciseRedisStore(ctx, client); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("server_name", func(t *testing.T) {
		// By IP, under a name the certificate carries.
		o := ok
		o.ServerName = redistest.ServerName
		client, err := Config{Addresses: []string{standalone.Addr()}, TLS: true, TLSOptions: o}.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		if err := client.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING with server_name %s: %v", o.ServerName, err)
		}
	})

	other := testpki.NewCA(t, "other")
	expired, foreign := ca.ExpiredClient(t, "expired"), other.Client(t, "foreign")
	for _, tt := range []struct {
		name string
		o    TLS
		want string
	}{
		{"wrong ca", TLS{CAFile: other.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile}, "x509: certificate signed by unknown authority"},
		{"no client certificate", TLS{CAFile: ca.CertFile}, "tls: certificate required"},
		{"expired client certificate", TLS{CAFile: ca.CertFile, CertFile: expired.CertFile, KeyFile: expired.KeyFile}, "tls: expired certificate"},
		{"client certificate of another CA", TLS{CAFile: ca.CertFile, CertFile: foreign.CertFile, KeyFile: foreign.KeyFile}, "tls: unknown certificate authority"},
		{"wrong server_name", TLS{CAFile: ca.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile, ServerName: "elsewhere.test"}, "x509: certificate is valid for"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client, err := Config{Addresses: []string{standalone.Addr()}, TLS: true, TLSOptions: tt.o}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 5, Window: time.Minute}, Options{Zone: "tls", Timeout: 2 * time.Second})
			_, err = r.Take(ctx, "k", 1)
			if err == nil {
				t.Fatalf("take succeeded, want an error saying %q", tt.want)
			}
			// Under TLS 1.3 the server's refusal of the client certificate
			// can reach the client as a reset; the probe then names it.
			if !strings.Contains(err.Error(), tt.want) {
				if alert := ProbeTLSRefusal(ctx, client, err); alert == nil || !strings.Contains(alert.Error(), tt.want) {
					t.Fatalf("take: %v, and the probe: %v; want either to say %q", err, alert, tt.want)
				}
			}
		})
	}
	if err := standalone.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("the server no longer answers a right client: %v", err)
	}
}

// TestProbeTLSRefusal: a connection the server reset after a TLS 1.3
// handshake names no cause; the probe asks the server, which refuses a
// client without a certificate with the alert that names it, and accepts
// one with a certificate, so the probe then names nothing; an error that
// is no reset is not probed at all.
func TestProbeTLSRefusal(t *testing.T) {
	ca := testpki.NewCA(t, "probe")
	good := ca.Client(t, "floodgate")
	server := redistest.StartTLS(t, redistest.TLS{CA: ca, Client: ca.Client(t, "harness")})
	ctx := context.Background()
	reset := func(addr string) error {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Errorf("take: %w", &net.OpError{Op: "write", Net: "tcp", Addr: tcp, Err: os.NewSyscallError("write", syscall.ECONNRESET)})
	}
	for _, tc := range []struct {
		name string
		o    TLS
		err  error
		want string // "" for no alert
	}{
		{"no client certificate, reset", TLS{CAFile: ca.CertFile}, reset(server.Addr()), "remote error: tls: certificate required"},
		{"no client certificate, not a reset", TLS{CAFile: ca.CertFile}, errors.New("NOSCRIPT"), ""},
		{"client certificate, reset", TLS{CAFile: ca.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile}, reset(server.Addr()), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := Config{Addresses: []string{server.Addr()}, TLS: true, TLSOptions: tc.o}.NewClient()
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			alert := ProbeTLSRefusal(ctx, client, tc.err)
			switch {
			case tc.want == "" && alert != nil:
				t.Errorf("probe: %v, want no alert", alert)
			case tc.want != "" && (alert == nil || !strings.Contains(alert.Error(), tc.want)):
				t.Errorf("probe: %v, want %q", alert, tc.want)
			}
		})
	}
	plain, err := Config{Addresses: []string{server.Addr()}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if alert := ProbeTLSRefusal(ctx, plain, reset(server.Addr())); alert != nil {
		t.Errorf("probe of a client without TLS: %v, want none", alert)
	}
}

package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// probeServer is a TLS 1.3 server on loopback whose certificate, signed
// by ca, names "localhost" alone (no IP SAN), asking client certificates
// as auth says; it completes each handshake and reads until the client
// goes. It returns its address by that name.
func probeServer(t *testing.T, ca *testpki.CA, auth tls.ClientAuthType) string {
	t.Helper()
	pair := ca.Server(t, "localhost")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   auth,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) {
		_ = c.(*tls.Conn).Handshake()
		_, _ = io.Copy(io.Discard, c)
	})
	return "localhost:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestProbeTLSRefusalByHostName: a reset names the IP the connection
// went to, but the client connects by a host name, which is all the
// server's certificate carries (no IP SAN, the common case): the probe
// dials by the client's name, a standalone client's address or the shard
// that resolves to the IP, so its own verification passes and the
// server's alert is read, for a reset as for an EOF, which names no
// address. (Guards against: the probe dialled the IP, failed to verify
// the server, and named nothing. The repository's TLS harness issues
// certificates for 127.0.0.1 too, which hid it.)
func TestProbeTLSRefusalByHostName(t *testing.T) {
	ca := testpki.NewCA(t, "probe-by-name")
	byName := probeServer(t, ca, tls.RequireAndVerifyClientCert)
	_, portText, _ := net.SplitHostPort(byName)
	port, _ := strconv.Atoi(portText)
	ctx := context.Background()
	const want = "remote error: tls: certificate required"
	// The reset as the connection reports it: its remote address, the IP.
	reset := fmt.Errorf("take: %w", &net.OpError{Op: "write", Net: "tcp",
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		Err:  os.NewSyscallError("write", syscall.ECONNRESET)})
	for _, cfg := range []Config{
		{Addresses: []string{byName}},
		{Shards: []string{byName}},
	} {
		cfg.TLS, cfg.TLSOptions = true, TLS{CAFile: ca.CertFile}
		client, err := cfg.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		for _, failure := range []error{fmt.Errorf("take: %w", io.EOF), reset} {
			if alert := ProbeTLSRefusal(ctx, client, failure); alert == nil || !strings.Contains(alert.Error(), want) {
				t.Errorf("%T of %s, %v: probe %v, want %q", client, byName, failure, alert, want)
			}
		}
	}
}

// TestProbeTLSRefusalRingEOF: an EOF names no server, so the probe asks
// every shard of a Ring, at once: one shard serves without asking for a
// client certificate and sends nothing, the other requires one the client
// lacks, and in 8 rings (each a fresh order of shards) the probe names
// the refusal. (Guards against: the shards were asked in turn under one
// 500ms wait, a healthy shard first held the whole wait, and 5 of 8 rings
// missed the refusal.)
func TestProbeTLSRefusalRingEOF(t *testing.T) {
	ca := testpki.NewCA(t, "probe-ring")
	ok := probeServer(t, ca, tls.NoClientCert)
	refuses := probeServer(t, ca, tls.RequireAndVerifyClientCert)
	const want = "remote error: tls: certificate required"
	missed := 0
	for i := range 8 {
		cfg := Config{Shards: []string{ok, refuses}, TLS: true, TLSOptions: TLS{CAFile: ca.CertFile}}
		client, err := cfg.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		alert := ProbeTLSRefusal(context.Background(), client, fmt.Errorf("take: %w", io.EOF))
		client.Close()
		if alert == nil || !strings.Contains(alert.Error(), want) {
			missed++
			t.Logf("ring %d: probe %v, want %q", i, alert, want)
		}
	}
	if missed > 0 {
		t.Errorf("%d of 8 rings: the refusing shard's alert was not read (a healthy shard probed first used up the probe's whole wait)", missed)
	}
}

package limiter

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
)

// TestProbeTLSRefusalByHostName: a reset names the IP the connection
// went to, but the client connects by a host name, which is all the
// server's certificate carries (no IP SAN, the common case): the probe
// dials by the client's name, a standalone client's address or the shard
// that resolves to the IP, so its own verification passes and the
// server's alert is read, for a reset as for an EOF, which names no
// address. (Found by a review: the probe dialled the IP, failed to verify
// the server, and named nothing. The repository's TLS harness issues
// certificates for 127.0.0.1 too, which hid it.)
func TestProbeTLSRefusalByHostName(t *testing.T) {
	ca := testpki.NewCA(t, "probe-by-name")
	srvPair := ca.Server(t, "localhost") // a name only, no IP SAN
	cert, err := tls.LoadX509KeyPair(srvPair.CertFile, srvPair.KeyFile)
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
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	byName := "localhost:" + strconv.Itoa(port)
	ctx := context.Background()
	const want = "remote error: tls: certificate required"
	// The reset as the connection reports it: its remote address, the IP.
	reset := fmt.Errorf("take: %w", &net.OpError{Op: "write", Net: "tcp",
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		Err:  os.NewSyscallError("write", syscall.ECONNRESET)})
	for _, cfg := range []RedisConfig{
		{Addresses: []string{byName}},
		{Shards: []string{byName}},
	} {
		cfg.TLS, cfg.TLSOptions = true, RedisTLS{CAFile: ca.CertFile}
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

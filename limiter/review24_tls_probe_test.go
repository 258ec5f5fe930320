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

// TestReviewProbeTLSRefusalKeepsServerName: the probe dials the address
// the reset names (failedAddr: the *net.OpError's Addr), which is the
// resolved IP the connection went to, not the name the client connects
// by, and its TLS config (cloned, ServerName empty when the redis block
// gives no server_name) then checks the server's certificate against
// that IP. A server whose certificate names its host only (no IP SAN,
// the common case) fails the probe's own verification before the server
// can judge the client, and the probe names nothing, though the same
// server refuses the client's missing certificate with an alert: the
// warm start then logs the generic "could not warm up" line instead of
// "set the tls block's cert and key". (The repository's TLS harness
// issues certificates for 127.0.0.1 too, which hides it.) The EOF form,
// for which failedAddr falls back to the client's own address, names it.
func TestReviewProbeTLSRefusalKeepsServerName(t *testing.T) {
	ca := testpki.NewCA(t, "rv24-probe")
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
	client, err := RedisConfig{Addresses: []string{"localhost:" + strconv.Itoa(port)}, TLS: true, TLSOptions: RedisTLS{CAFile: ca.CertFile}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	const want = "remote error: tls: certificate required"

	// Control: an EOF names no address, so the probe dials the client's
	// own ("localhost:port") and gets the server's alert.
	if alert := ProbeTLSRefusal(ctx, client, fmt.Errorf("take: %w", io.EOF)); alert == nil || !strings.Contains(alert.Error(), want) {
		t.Fatalf("control, EOF: probe %v, want %q", alert, want)
	}
	// The reset as the connection reports it: its remote address, the IP.
	reset := fmt.Errorf("take: %w", &net.OpError{Op: "write", Net: "tcp",
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		Err:  os.NewSyscallError("write", syscall.ECONNRESET)})
	if alert := ProbeTLSRefusal(ctx, client, reset); alert == nil || !strings.Contains(alert.Error(), want) {
		t.Fatalf("reset from 127.0.0.1:%d of a client of localhost:%d: probe %v, want %q (the probe verified the server's certificate against the IP)", port, port, alert, want)
	}
}

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
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
)

// TestProbeTLSRefusalRingEOF: an EOF names no server, so the probe asks
// every shard of a Ring, at once: one shard serves without asking for a
// client certificate and sends nothing, the other requires one the client
// lacks, and in 8 rings (each a fresh order of shards) the probe names
// the refusal. (Found by a review: the shards were asked in turn under one
// 500ms wait, a healthy shard first held the whole wait, and 5 of 8 rings
// missed the refusal.)
func TestProbeTLSRefusalRingEOF(t *testing.T) {
	ca := testpki.NewCA(t, "probe-ring")
	srvPair := ca.Server(t, "localhost")
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
	serve := func(auth tls.ClientAuthType) string {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   auth,
			ClientCAs:    pool,
			MinVersion:   tls.VersionTLS13,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
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
		return "localhost:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	ok := serve(tls.NoClientCert)
	refuses := serve(tls.RequireAndVerifyClientCert)
	const want = "remote error: tls: certificate required"
	missed := 0
	for i := range 8 {
		cfg := RedisConfig{Shards: []string{ok, refuses}, TLS: true, TLSOptions: RedisTLS{CAFile: ca.CertFile}}
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

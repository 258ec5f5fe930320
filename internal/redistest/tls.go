package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strconv"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
)

// TLS is how StartTLS and StartClusterTLS serve: over TLS only (--port 0),
// with a server certificate CA signs for 127.0.0.1, localhost and
// ServerName.
type TLS struct {
	// CA signs the server's certificate and is the one CA the server
	// trusts for client certificates (tls-ca-cert-file).
	CA *testpki.CA
	// AuthClients is tls-auth-clients: "yes" (when empty) requires a
	// client certificate signed by CA, "optional" checks one if sent,
	// "no" asks for none.
	AuthClients string
	// Client is the certificate the harness's own connections present
	// (readiness, Client, redis-cli): a test makes it with CA.Client.
	Client testpki.Pair
}

// ServerName is a name the servers' certificates carry besides 127.0.0.1
// and localhost, for tests of a client's server_name.
const ServerName = "redis.floodgate.test"

// StartTLS starts a standalone server that serves TLS only, on the port
// Addr names, as configured by o.
func StartTLS(t testing.TB, o TLS) *Server {
	t.Helper()
	return startTLS(t, &o, nil)
}

// tlsArgs are the redis-server arguments of a TLS-only server on port,
// with cluster bus and replication over TLS too.
func (o *TLS) tlsArgs(t testing.TB, port int) []string {
	t.Helper()
	server := o.CA.Server(t, "127.0.0.1", "localhost", ServerName)
	auth := o.AuthClients
	if auth == "" {
		auth = "yes"
	}
	return []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", server.CertFile,
		"--tls-key-file", server.KeyFile,
		"--tls-ca-cert-file", o.CA.CertFile,
		"--tls-auth-clients", auth,
		"--tls-replication", "yes",
		"--tls-cluster", "yes",
	}
}

// clientConfig is the tls.Config of the harness's own connections.
func (o *TLS) clientConfig(t testing.TB) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(o.CA.CertFile)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("redistest: no certificate in %s", o.CA.CertFile)
	}
	c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if o.Client.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(o.Client.CertFile, o.Client.KeyFile)
		if err != nil {
			t.Fatalf("redistest: client certificate: %v", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

// cliArgs are redis-cli's options for connecting as the harness does.
func (o *TLS) cliArgs() []string {
	args := []string{"--tls", "--cacert", o.CA.CertFile}
	if o.Client.CertFile != "" {
		args = append(args, "--cert", o.Client.CertFile, "--key", o.Client.KeyFile)
	}
	return args
}

// TLSConfig is the TLS the harness's own connections to s use (its CA,
// and the client certificate of the TLS it was started with), for a
// client of a test's own making; nil for a plain-TCP server.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// Package testpki makes the certificates of TLS tests: a CA, server and
// client certificates it signs, an expired client certificate, and a
// second CA whose certificates the first does not trust, each written as
// PEM files to the test's temporary directory. Keys are made when the test
// runs (ECDSA P-256, quick to generate), so no key is ever committed and
// no openssl is needed.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// validity is how long around now the certificates are valid: wide
// enough that a slow test run never meets their end, and NotBefore in
// the past so a server whose clock is a little behind accepts them.
const validity = 24 * time.Hour

// CA is a certificate authority of one test.
type CA struct {
	// CertFile is the CA certificate, PEM: what a client's ca or a
	// server's tls-ca-cert-file names.
	CertFile string

	name string
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Pair is a certificate and its key, each a PEM file.
type Pair struct {
	CertFile, KeyFile string
}

// NewCA makes a self-signed CA called name, its files in a fresh
// temporary directory of t.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		// Never a leaf's subject too: OpenSSL takes a certificate whose
		// subject is its issuer's for a self-signed one and refuses it.
		Subject:               pkix.Name{CommonName: "test CA " + name},
		NotBefore:             now.Add(-validity),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testpki: making CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testpki: parsing CA %s: %v", name, err)
	}
	ca := &CA{name: name, dir: t.TempDir(), cert: cert, key: key}
	ca.CertFile = ca.write(t, fileName(name)+"-ca.pem", "CERTIFICATE", der)
	return ca
}

// Server issues a certificate for hosts (DNS names or IP addresses), for
// serving TLS and, as Redis Cluster nodes and replicas use their server
// certificate to connect to each other, for presenting as a client too.
func (ca *CA) Server(t testing.TB, hosts ...string) Pair {
	t.Helper()
	tmpl := ca.template(t, "server "+strings.Join(hosts, ","), time.Now().Add(validity))
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(t, "server-"+fileName(strings.Join(hosts, "-")), tmpl)
}

// Client issues a client certificate called name.
func (ca *CA) Client(t testing.TB, name string) Pair {
	t.Helper()
	return ca.client(t, name, time.Now().Add(validity))
}

// ExpiredClient issues a client certificate called name that expired an
// hour ago.
func (ca *CA) ExpiredClient(t testing.TB, name string) Pair {
	t.Helper()
	return ca.client(t, name, time.Now().Add(-time.Hour))
}

func (ca *CA) client(t testing.TB, name string, notAfter time.Time) Pair {
	t.Helper()
	tmpl := ca.template(t, name, notAfter)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t, "client-"+fileName(name), tmpl)
}

// template is a leaf certificate's common fields.
func (ca *CA) template(t testing.TB, name string, notAfter time.Time) *x509.Certificate {
	t.Helper()
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-validity),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
}

// issue signs tmpl with a new key and writes both, as base-cert.pem and
// base-key.pem.
func (ca *CA) issue(t testing.TB, base string, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testpki: issuing %s by %s: %v", tmpl.Subject.CommonName, ca.name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testpki: encoding the key of %s: %v", tmpl.Subject.CommonName, err)
	}
	return Pair{
		CertFile: ca.write(t, base+"-cert.pem", "CERTIFICATE", der),
		KeyFile:  ca.write(t, base+"-key.pem", "PRIVATE KEY", keyDER),
	}
}

// write writes one PEM block to name in the CA's directory, readable by
// its owner only, as a key must be.
func (ca *CA) write(t testing.TB, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testpki: %v", err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testpki: generating a key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testpki: serial number: %v", err)
	}
	return n
}

// fileName keeps what a file name may hold of s.
func fileName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		}
		return '_'
	}, s)
}

// String names the CA, for test messages.
func (ca *CA) String() string { return fmt.Sprintf("test CA %s", ca.name) }

package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS is the tls block of a Config: whom Floodgate trusts to be
// its Redis, and what it shows a server that asks for a client
// certificate (tls-auth-clients). Every field is optional; the zero value
// verifies the server against the system's CAs by the host dialled, as a
// bare `tls` or a rediss:// URL does. The files are read by NewClient, so
// a config that names a missing or invalid one is refused when it loads,
// not at the first decision.
type TLS struct {
	// CAFile is a PEM file of the CAs that sign the servers' certificates,
	// trusted instead of the system's: a managed Redis's or a private CA.
	CAFile string
	// CertFile and KeyFile are the client certificate (PEM, with any
	// intermediates after it) and its private key (PEM), for a server that
	// requires one. One without the other is refused.
	CertFile, KeyFile string
	// ServerName is the name the servers' certificates must carry, and the
	// SNI sent, when it is not the host dialled: an address by IP, a
	// tunnel, or a Cluster node or Sentinel master announced by IP.
	ServerName string
}

// set reports whether any field of the tls block is given.
func (t TLS) set() bool { return t != TLS{} }

// ValidateTLS is the part of Validate that checks the tls block: a
// client certificate without its key (or a key without its certificate),
// or a ca that insecure_skip_verify would ignore. The adapter runs it
// when the block closes, so the refusal points at the block's line. It
// reads no file: Validate runs before placeholders are resolved, and
// NewClient reads them.
func (c Config) ValidateTLS() error {
	t := c.TLSOptions
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		return errors.New("cert needs key: a client certificate is sent with its private key")
	case t.KeyFile != "" && t.CertFile == "":
		return errors.New("key needs cert: the private key is sent with its client certificate")
	case t.CAFile != "" && c.InsecureSkipVerify:
		return errors.New("ca and insecure_skip_verify contradict each other: insecure_skip_verify checks the server's certificate against nothing")
	}
	return nil
}

// apply adds the block's CAs, client certificate and server name to cfg.
// An error names the file it is about and what is wrong with it, never
// what the file holds (a key file's content is a secret).
func (t TLS) apply(cfg *tls.Config) error {
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return fmt.Errorf("tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls ca %s: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		certPEM, err := os.ReadFile(t.CertFile)
		if err != nil {
			return fmt.Errorf("tls cert: %w", err)
		}
		keyPEM, err := os.ReadFile(t.KeyFile)
		if err != nil {
			return fmt.Errorf("tls key: %w", err)
		}
		// crypto/tls's errors say what is missing or mismatched, without
		// quoting the PEM.
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return fmt.Errorf("tls cert %s and key %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if t.ServerName != "" {
		cfg.ServerName = t.ServerName
	}
	return nil
}

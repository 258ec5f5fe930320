package jwtauth

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
)

// loadPEMPublicKey reads the first public key of a PEM file. Operators get
// keys from identity providers in several wrappings, so a PKIX public key,
// a PKCS #1 RSA public key and a certificate are all accepted; other blocks
// (a private key put there by mistake, for one) are passed over.
func loadPEMPublicKey(path string) (any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%s: no PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE block", path)
		}
		switch block.Type {
		case "PUBLIC KEY":
			pub, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing public key: %w", path, err)
			}
			return pub, nil
		case "RSA PUBLIC KEY":
			pub, err := x509.ParsePKCS1PublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing RSA public key: %w", path, err)
			}
			return pub, nil
		case "CERTIFICATE":
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: parsing certificate: %w", path, err)
			}
			return cert.PublicKey, nil
		}
	}
}

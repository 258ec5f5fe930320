package jwtauth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	jose "github.com/go-jose/go-jose/v4"
)

// maxJWKSKeys bounds how many keys of one set are kept.
const maxJWKSKeys = 100

// jwkPublicMembers are the JWK members (RFC 7517, 7518, 8037) handed to
// go-jose. Everything else is dropped first: private members, so that a
// provider wrongly publishing private keys is read for its public keys and
// go-jose never parses private material from the network, and x5c and its
// thumbprints, which are not used to verify tokens.
var jwkPublicMembers = []string{"kty", "kid", "use", "alg", "crv", "n", "e", "x", "y"}

// jwkCoordinateSize is the byte length of an EC coordinate per curve.
var jwkCoordinateSize = map[string]int{"P-256": 32, "P-384": 48, "P-521": 66}

// parseJWKS decodes a JWK Set document. Keys are decoded one by one rather
// than as a jose.JSONWebKeySet, which fails whole on one key it cannot
// read: RFC 7517 section 5 asks for such keys to be ignored. Keys that
// cannot verify signatures (encryption keys, symmetric keys, unknown types,
// malformed members) are skipped and reported in skipped; the set is an
// error only if it is not JSON or holds no usable key.
func parseJWKS(body []byte) (keys []*key, skipped []error, err error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, nil, fmt.Errorf("decoding JWK set: %w", err)
	}
	for i, raw := range doc.Keys {
		if len(keys) == maxJWKSKeys {
			skipped = append(skipped, fmt.Errorf("keys after the first %d ignored", maxJWKSKeys))
			break
		}
		k, kid, err := parseJWK(raw)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("key %d (kid %q): %w", i, kid, err))
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, skipped, errors.New("JWK set holds no usable signature key")
	}
	return keys, skipped, nil
}

// parseJWK converts one JWK into a public key pinned to the algorithms its
// type allows (narrowed to its "alg" member when present). kid is returned
// even on error, for the log line.
func parseJWK(raw json.RawMessage) (k *key, kid string, err error) {
	members, kid, err := publicJWKMembers(raw)
	if err != nil {
		return nil, kid, err
	}
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(members); err != nil {
		return nil, kid, fmt.Errorf("decoding JWK: %w", err)
	}
	if jwk.Use != "" && jwk.Use != "sig" {
		return nil, kid, fmt.Errorf("use %q is not a signature key", jwk.Use)
	}
	var algs []string
	switch pub := jwk.Key.(type) {
	case *rsa.PublicKey:
		// go-jose refuses moduli above 4096 bits; small ones are refused
		// here, and so are exponents no signer uses.
		if bits := pub.N.BitLen(); bits < 1024 {
			return nil, kid, fmt.Errorf("RSA modulus of %d bits is below 1024", bits)
		}
		if pub.E < 3 || pub.E > 1<<31-1 || pub.E%2 == 0 {
			return nil, kid, errors.New("RSA exponent out of range")
		}
		algs = rsaAlgs
	case *ecdsa.PublicKey:
		if algs, err = publicKeyAlgs(pub); err != nil {
			return nil, kid, err
		}
	case ed25519.PublicKey:
		algs = edDSAAlgs
	default:
		return nil, kid, fmt.Errorf("unsupported key type %T for a signature key", jwk.Key)
	}
	if jwk.Algorithm != "" {
		if !slices.Contains(algs, jwk.Algorithm) {
			return nil, kid, fmt.Errorf("alg %q does not fit the key's type", jwk.Algorithm)
		}
		algs = []string{jwk.Algorithm}
	}
	return &key{kid: jwk.KeyID, pub: jwk.Key, algs: algs}, kid, nil
}

// publicJWKMembers re-encodes a JWK with only its public members, in the
// strict form go-jose reads. Encoders in the wild are not always strict,
// and these keys were accepted before go-jose read them, so two slips are
// repaired rather than refused: base64url padding is removed, and an EC
// coordinate whose leading zero bytes were dropped is padded back to the
// curve's size (it must still be a point on the curve).
func publicJWKMembers(raw json.RawMessage) (members []byte, kid string, err error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, "", fmt.Errorf("decoding JWK: %w", err)
	}
	_ = json.Unmarshal(all["kid"], &kid) // only for messages; go-jose checks its type
	var crv string
	_ = json.Unmarshal(all["crv"], &crv)
	kept := make(map[string]json.RawMessage, len(jwkPublicMembers))
	for _, name := range jwkPublicMembers {
		val, ok := all[name]
		if !ok {
			continue
		}
		var s string
		if name != "n" && name != "e" && name != "x" && name != "y" || json.Unmarshal(val, &s) != nil || s == "" {
			kept[name] = val
			continue
		}
		s = strings.TrimRight(s, "=")
		if size := jwkCoordinateSize[crv]; size > 0 && (name == "x" || name == "y") {
			b, err := base64.RawURLEncoding.DecodeString(s)
			if err != nil {
				return nil, kid, fmt.Errorf("member %q: %w", name, err)
			}
			if len(b) < size {
				s = base64.RawURLEncoding.EncodeToString(append(make([]byte, size-len(b)), b...))
			}
		}
		if kept[name], err = json.Marshal(s); err != nil {
			return nil, kid, fmt.Errorf("member %q: %w", name, err)
		}
	}
	members, err = json.Marshal(kept)
	if err != nil {
		return nil, kid, fmt.Errorf("encoding JWK: %w", err)
	}
	return members, kid, nil
}

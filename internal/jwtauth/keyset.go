package jwtauth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"slices"

	"github.com/golang-jwt/jwt/v5"
)

// maxKidlessCandidates bounds how many keys a token without a kid is tried
// against, so one such token costs a bounded number of signature checks.
const maxKidlessCandidates = 8

// Algorithms each key type may verify. HMAC is only ever accepted for a
// configured secret, never for a public key.
var (
	hmacAlgs       = []string{"HS256", "HS384", "HS512"}
	rsaAlgs        = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	edDSAAlgs      = []string{"EdDSA"}
	asymmetricAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
	curveAlgs      = map[int][]string{256: {"ES256"}, 384: {"ES384"}, 521: {"ES512"}}
)

// key is one verification key and the algorithms it may verify.
type key struct {
	kid string
	// pub is []byte (HMAC secret), *rsa.PublicKey, *ecdsa.PublicKey or
	// ed25519.PublicKey.
	pub  any
	algs []string
}

// accepts reports whether m may be verified with k: the algorithm is one
// pinned to the key, and the method's Go type matches the key's type (so an
// HS256 token can never be checked against a public key used as an HMAC
// secret, and an ES256 token never against a P-384 key).
func (k *key) accepts(m jwt.SigningMethod) bool {
	if m == nil || !slices.Contains(k.algs, m.Alg()) {
		return false
	}
	switch pub := k.pub.(type) {
	case []byte:
		_, ok := m.(*jwt.SigningMethodHMAC)
		return ok
	case *rsa.PublicKey:
		switch m.(type) {
		case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
			return true
		}
		return false
	case *ecdsa.PublicKey:
		em, ok := m.(*jwt.SigningMethodECDSA)
		return ok && pub.Curve != nil && pub.Curve.Params().BitSize == em.CurveBits
	case ed25519.PublicKey:
		_, ok := m.(*jwt.SigningMethodEd25519)
		return ok
	}
	return false
}

// publicKeyAlgs returns the algorithms a public key may verify.
func publicKeyAlgs(pub any) ([]string, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return rsaAlgs, nil
	case *ecdsa.PublicKey:
		if k.Curve == nil {
			return nil, errors.New("ECDSA key without a curve")
		}
		algs, ok := curveAlgs[k.Curve.Params().BitSize]
		if !ok {
			return nil, fmt.Errorf("unsupported ECDSA curve %s", k.Curve.Params().Name)
		}
		return algs, nil
	case ed25519.PublicKey:
		return edDSAAlgs, nil
	}
	return nil, fmt.Errorf("unsupported public key type %T (want RSA, ECDSA or Ed25519)", pub)
}

// keySet is an immutable set of verification keys. A new set replaces the
// old one atomically, so requests never wait for a fetch.
type keySet struct {
	keys  []*key
	byKid map[string][]*key
	// ignoreKid is set for keys from the configuration (secret, public
	// key): there is only one key, whatever kid the token names.
	ignoreKid bool
	// gen changes whenever the content of the set changes; cached results
	// carry the generation they were computed under and die with it.
	gen uint64
}

func newKeySet(keys []*key, ignoreKid bool, gen uint64) *keySet {
	s := &keySet{keys: keys, ignoreKid: ignoreKid, gen: gen, byKid: make(map[string][]*key, len(keys))}
	for _, k := range keys {
		s.byKid[k.kid] = append(s.byKid[k.kid], k)
	}
	return s
}

// find returns the key (or a jwt.VerificationKeySet of keys) that may verify
// a token signed with m under kid. miss reports that the token names a key
// the set does not hold (or the set is empty), which is worth a refetch.
func (s *keySet) find(kid string, hasKid bool, m jwt.SigningMethod) (pub any, miss bool, err error) {
	if len(s.keys) == 0 {
		return nil, true, errors.New("no verification keys loaded")
	}
	candidates := s.keys
	if hasKid && !s.ignoreKid {
		var ok bool
		if candidates, ok = s.byKid[kid]; !ok {
			if len(kid) > 64 {
				kid = kid[:64] + "..."
			}
			return nil, true, fmt.Errorf("no key with kid %q", kid)
		}
	}
	var usable []jwt.VerificationKey
	for _, k := range candidates {
		if k.accepts(m) {
			usable = append(usable, k.pub)
			if len(usable) == maxKidlessCandidates {
				break
			}
		}
	}
	switch len(usable) {
	case 0:
		return nil, false, fmt.Errorf("no key accepts algorithm %s", m.Alg())
	case 1:
		return usable[0], false, nil
	}
	return jwt.VerificationKeySet{Keys: usable}, false, nil
}

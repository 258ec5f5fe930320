package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"
)

// KeyHasher names client keys where they are stored or shown without
// being kept (Redis key names; in the Caddy adapter, samples, logs and the
// admin API's top): the first 16 bytes of their SHA-256, or with a secret
// of their HMAC-SHA256. Without a secret the name of a key with little
// entropy can be reversed by hashing every candidate (an IPv4 address in
// at most 2^32 hashes); with one it cannot, as long as the secret is kept.
// The nil *KeyHasher is the unkeyed SHA-256. Safe for concurrent use.
type KeyHasher struct {
	// macs recycles keyedSums: building an HMAC hashes the secret into
	// its pads, and Reset restores those states from a copy.
	macs sync.Pool
}

// keyedSum is one HMAC of the secret with the buffers a name needs, so
// naming a key allocates nothing.
type keyedSum struct {
	mac hash.Hash
	in  []byte
	sum [sha256.Size]byte
}

// NewKeyHasher returns the hasher keyed by secret, or nil (SHA-256) for an
// empty secret.
func NewKeyHasher(secret []byte) *KeyHasher {
	if len(secret) == 0 {
		return nil
	}
	secret = append([]byte(nil), secret...)
	return &KeyHasher{macs: sync.Pool{New: func() any {
		return &keyedSum{mac: hmac.New(sha256.New, secret), in: make([]byte, 0, 64)}
	}}}
}

// Sum is key's 16-byte name.
func (h *KeyHasher) Sum(key string) [16]byte {
	var out [16]byte
	if h == nil {
		sum := sha256.Sum256([]byte(key))
		copy(out[:], sum[:16])
		return out
	}
	k := h.macs.Get().(*keyedSum)
	k.mac.Reset()
	k.in = append(k.in[:0], key...)
	_, _ = k.mac.Write(k.in)
	copy(out[:], k.mac.Sum(k.sum[:0]))
	if cap(k.in) <= 1024 {
		h.macs.Put(k)
	}
	return out
}

// Hex is key's name in hex, 32 characters.
func (h *KeyHasher) Hex(key string) string {
	sum := h.Sum(key)
	return hex.EncodeToString(sum[:])
}

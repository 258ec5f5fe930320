package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"testing"
)

// TestKeyHasher: without a secret a key's name is 16 bytes of its
// SHA-256; with one, 16 bytes of its HMAC-SHA256, the same from every
// goroutine (TestKeyNamesHashed, in limiter/redisstore, checks that a
// Redis store names its keys so).
func TestKeyHasher(t *testing.T) {
	const key = "203.0.113.7"
	plain := sha256.Sum256([]byte(key))
	if got := (*KeyHasher)(nil).Hex(key); got != hex.EncodeToString(plain[:16]) {
		t.Fatalf("unkeyed name %s", got)
	}
	if NewKeyHasher(nil) != nil {
		t.Fatal("an empty secret keyed the hash")
	}
	secret := []byte("0123456789abcdef-secret")
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	want := hex.EncodeToString(mac.Sum(nil)[:16])
	h := NewKeyHasher(secret)
	secret[0] = 'X' // the hasher keeps its own copy
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if got := h.Hex(key); got != want {
					t.Errorf("keyed name %s, want %s", got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkKeyHasher(b *testing.B) {
	const key = "203.0.113.7:/api/items"
	for _, bc := range []struct {
		name string
		h    *KeyHasher
	}{{"sha256", nil}, {"hmac", NewKeyHasher([]byte("0123456789abcdef-secret"))}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = bc.h.Sum(key)
			}
		})
	}
}

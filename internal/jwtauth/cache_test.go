package jwtauth

import (
	"fmt"
	"testing"
)

func TestJWTCacheBoundsAndKeys(t *testing.T) {
	c := newCache(64)
	claims := map[string]any{"sub": "x"}
	for i := range 10000 {
		tok := fmt.Sprintf("token-%d", i)
		c.put(uint64(i)*0x9E3779B97F4A7C15, tok, claims, int64(i+1000), 0)
	}
	if n := c.len(); n > 64+cacheShards || n < 32 {
		t.Fatalf("cache holds %d entries, bound 64", n)
	}
	// Same hash, different token: a miss, never the other token's claims.
	c.put(7, "token-a", claims, 1<<62, 0)
	if _, hit := c.get(7, "token-b", 0, 0); hit {
		t.Fatal("hash collision returned another token's claims")
	}
	if got, hit := c.get(7, "token-a", 0, 0); !hit || got["sub"] != "x" {
		t.Fatal("stored entry not found")
	}
	// Another key set generation or a passed expiry is a miss.
	if _, hit := c.get(7, "token-a", 0, 1); hit {
		t.Fatal("entry of an old generation served")
	}
	if _, hit := c.get(7, "token-a", 1<<62, 0); hit {
		t.Fatal("expired entry served")
	}
	// Eviction takes the entry that expires first (or one of an old key
	// set generation).
	small := newCache(2 * cacheShards) // two entries per shard
	small.put(0, "long", claims, 1000, 0)
	small.put(cacheShards, "short", claims, 10, 0)
	small.put(2*cacheShards, "new", claims, 500, 0) // same shard: evicts "short"
	for h, tok := range map[uint64]string{0: "long", 2 * cacheShards: "new"} {
		if _, hit := small.get(h, tok, 0, 0); !hit {
			t.Errorf("%s evicted", tok)
		}
	}
	if _, hit := small.get(cacheShards, "short", 0, 0); hit {
		t.Error("the entry closest to expiry survived")
	}
	small.put(3*cacheShards, "gen1", claims, 10, 1) // evicts an entry of generation 0
	if small.len() != 2 {
		t.Fatalf("shard over its bound: %d", small.len())
	}
}

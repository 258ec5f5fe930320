package ratelimit

// A flood of a million distinct keys against a memory zone, in this
// process; the floods through a real Caddy are in e2e/flood_test.go.

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestFloodMemoryMillionKeys: a million distinct keys against a memory
// zone with max_keys 100000 leave it holding at most 100,000 keys, and
// the heap within what those keys cost. It runs in this process, through
// the provisioned Handler's ServeHTTP, because a million requests through
// a real Caddy take minutes on a small machine and only here can the
// heap be read without the HTTP server's own buffers in it.
//
// The bound: BENCHMARKS.md measures 84.9 bytes per token-bucket key in the
// memory store; with the per-key overhead of the LRU bookkeeping and map
// slack rounded up to 200 bytes per key, 100,000 keys are 20 MB, and 8 MB
// more covers what the handler keeps that does not grow with keys (the
// hot-keys counter, pools, the race detector's own heap use).
func TestFloodMemoryMillionKeys(t *testing.T) {
	const keys, maxKeys = 1_000_000, 100_000
	const perKey, slack = 200, 8 << 20
	before := heapInUse()
	h := provisionHandler(t, `rate_limit {
		zone flood_mem {
			key header X-Client
			algorithm token_bucket
			rate 10/1h
		}
		max_keys 100000
	}`)
	began := time.Now()
	const workers = 2
	var wg sync.WaitGroup
	codes := make([]map[int]int, workers)
	for w := range workers {
		codes[w] = map[int]int{}
		wg.Go(func() {
			for i := w; i < keys; i += workers {
				r, _ := newKeyRequest("198.51.100.7", map[string]string{"X-Client": fmt.Sprintf("flood-%d", i)})
				_, code := serve(h, r, okHandler)
				codes[w][code]++
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	after := heapInUse()
	held := h.zones[0].keysHeld()
	growth := int64(after) - int64(before)
	bound := int64(perKey*maxKeys + slack)
	t.Logf("%d distinct keys in %v (%v each): zone holds %d keys; heap %d MB before, %d MB after, growth %d bytes (%.1f per held key), bound %d; codes %v %v",
		keys, took.Round(time.Millisecond), (took / keys).Round(time.Nanosecond), held, before>>20, after>>20, growth,
		float64(growth)/float64(max(held, 1)), bound, codes[0], codes[1])
	if codes[0][http.StatusOK]+codes[1][http.StatusOK] != keys {
		t.Errorf("codes %v %v: every first request of a key should pass", codes[0], codes[1])
	}
	if held > maxKeys {
		t.Errorf("the zone holds %d keys, max_keys is %d", held, maxKeys)
	}
	if growth > bound {
		t.Errorf("the heap grew %d bytes, want at most %d (%d bytes × %d keys + %d)", growth, bound, perKey, maxKeys, slack)
	}
}

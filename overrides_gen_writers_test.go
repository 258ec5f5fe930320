package ratelimit

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestOverrideConcurrentPutsOfDifferentLimitsRedis: 24 PUTs of one key at
// once, each of a different limit, on a redis zone, 4 rounds: every one
// is answered 200. (Found by a review: SetGen gave up after 8 conditional
// writes refused by the others, and the admin API answered 502, the
// status of an unreachable Redis: 34 to 51 of 96 failed. A write other
// instances outrun 100 times is now answered 409.)
func TestOverrideConcurrentPutsOfDifferentLimitsRedis(t *testing.T) {
	srv := redistest.Start(t)
	const name, key = "ov_puts_at_once", "198.51.100.201"
	provisionHandler(t, `rate_limit {
		zone `+name+` {
			key ip
			algorithm fixed_window
			rate 10/1h
			store redis
		}
		redis {
			url redis://`+srv.Addr()+`
		}
	}`)
	t.Cleanup(func() { adminOverride(t, http.MethodDelete, name, key, "") })
	var (
		mu     sync.Mutex
		failed = map[int]int{}
		total  int
	)
	for round := range 4 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 24 {
			total++
			wg.Go(func() {
				<-start
				body := fmt.Sprintf(`{"limit": %d}`, 1+round*100+i)
				if code, msg := adminOverride(t, http.MethodPut, name, key, body); code != 200 {
					mu.Lock()
					failed[code]++
					if len(failed) == 1 && failed[code] == 1 {
						t.Logf("PUT %s: %d %s", body, code, msg)
					}
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if len(failed) > 0 {
		t.Errorf("of %d PUTs of different limits at once, failed by status: %v", total, failed)
	}
}

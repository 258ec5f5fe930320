// Command soakload drives mixed traffic at a Caddy for bench/soak.sh: a
// few workers, each at a fixed pace, rotating over the given URLs with a
// client key (X-Client) drawn from a bounded key space, so zones see new
// keys, repeated keys and refusals. It stops after -duration and prints
// how many answers of each status it got.
package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

func main() {
	duration := flag.Duration("duration", time.Minute, "how long to send")
	workers := flag.Int("workers", 4, "concurrent clients")
	every := flag.Duration("every", 5*time.Millisecond, "pause between one worker's requests")
	keys := flag.Int("keys", 20000, "distinct client keys")
	urls := flag.String("urls", "", "comma-separated URLs to rotate over (127.0.0.1 only)")
	flag.Parse()
	targets := strings.Split(*urls, ",")
	for _, u := range targets {
		if !strings.HasPrefix(u, "http://127.0.0.1:") {
			fmt.Fprintf(os.Stderr, "soakload: %q: only http://127.0.0.1 URLs\n", u)
			os.Exit(2)
		}
	}
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: *workers},
		Timeout:   10 * time.Second,
	}
	var mu sync.Mutex
	counts := map[string]int{}
	stop := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			local := map[string]int{}
			for i := 0; time.Now().Before(stop); i++ {
				req, err := http.NewRequest(http.MethodGet, targets[(i+w)%len(targets)], nil)
				if err != nil {
					panic(err)
				}
				// Skewed keys: half the requests from 0.1% of the keys
				// (they get refused), the rest spread over the whole space.
				k := rng.IntN(*keys)
				if rng.IntN(2) == 0 {
					k = rng.IntN(max(*keys/1000, 1))
				}
				req.Header.Set("X-Client", fmt.Sprintf("soak-%d", k))
				status := "error"
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = fmt.Sprint(resp.StatusCode)
				}
				local[status]++
				time.Sleep(*every)
			}
			mu.Lock()
			for s, n := range local {
				counts[s] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	var parts []string
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%s: %d", s, n))
	}
	sort.Strings(parts)
	fmt.Printf("soakload: %s\n", strings.Join(parts, ", "))
}

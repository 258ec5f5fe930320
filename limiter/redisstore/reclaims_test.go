package redisstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

// heardNames collects the names a Listen heard.
type heardNames struct {
	mu    sync.Mutex
	names []string
}

func (h *heardNames) on(name string) {
	h.mu.Lock()
	h.names = append(h.names, name)
	h.mu.Unlock()
}

func (h *heardNames) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.names...)
}

// TestReclaimsReachOtherInstances: a request for a key's leases reaches
// every other instance listening to its zone, on a standalone server, a
// Cluster and shards; not the instance that asked, not another zone's
// listeners, and not a Listen that stopped.
func TestReclaimsReachOtherInstances(t *testing.T) {
	for _, srv := range []struct {
		name string
		cfg  func(t *testing.T) Config
	}{
		{"standalone", func(t *testing.T) Config { return Config{Addresses: []string{redistest.Start(t).Addr()}} }},
		{"cluster", func(t *testing.T) Config { return Config{Addresses: redistest.StartCluster(t, 3).Addrs()} }},
		{"shards", func(t *testing.T) Config { return Config{Shards: storetest.StartShards(t, 3).Addrs()} }},
	} {
		t.Run(srv.name, func(t *testing.T) {
			cfg := srv.cfg(t)
			var recs [3]*Reclaims
			var heard [3]heardNames
			var other heardNames
			stops := make([]func(), 3)
			for i := range recs {
				r, err := NewReclaims(redisClient(t, cfg), ReclaimsOptions{OnError: func(err error) { t.Logf("instance %d: %v", i, err) }})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.Close() })
				recs[i] = r
				stops[i] = r.Listen("api", heard[i].on)
			}
			stopOther := recs[2].Listen("web", other.on)
			defer stopOther()
			for i, r := range recs {
				testutil.Eventually(t, fmt.Sprintf("instance %d to listen", i), func() error {
					if !r.Listening("api") || (i == 2 && !r.Listening("web")) {
						return errors.New("not subscribed yet")
					}
					return nil
				})
			}
			recs[0].Ask("api", "fg:api:{k1}")
			testutil.Eventually(t, "the others to hear it", func() error {
				for i := 1; i < 3; i++ {
					if got := heard[i].got(); len(got) != 1 || got[0] != "fg:api:{k1}" {
						return fmt.Errorf("instance %d heard %q", i, got)
					}
				}
				return nil
			})
			stops[2]()
			recs[1].Ask("api", "fg:api:{k2}")
			testutil.Eventually(t, "instance 0 to hear it", func() error {
				if got := heard[0].got(); len(got) != 1 || got[0] != "fg:api:{k2}" {
					return fmt.Errorf("instance 0 heard %q", got)
				}
				return nil
			})
			// Time for anything wrongly delivered to arrive.
			time.Sleep(50 * time.Millisecond)
			if got := heard[1].got(); len(got) != 1 {
				t.Errorf("instance 1 heard %q: its own request included", got)
			}
			if got := heard[2].got(); len(got) != 1 {
				t.Errorf("instance 2 heard %q after it stopped listening", got)
			}
			if got := other.got(); len(got) != 0 {
				t.Errorf("zone web heard zone api's requests: %q", got)
			}
		})
	}
}

package redisstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter/internal/storetest"
)

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
			var names [3]heard[string]
			var other heard[string]
			var listeners [3]*ReclaimListener
			for i := range recs {
				r, err := NewReclaims(redisClient(t, cfg), ReclaimsOptions{OnError: func(err error) { t.Logf("instance %d: %v", i, err) }})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.Close() })
				recs[i] = r
				listeners[i] = r.Listen("api", names[i].add)
			}
			defer recs[2].Listen("web", other.add).Stop()
			for i, r := range recs {
				testutil.Eventually(t, fmt.Sprintf("instance %d to listen", i), func() error {
					if !r.Listening("api") || (i == 2 && !r.Listening("web")) {
						return errors.New("not subscribed yet")
					}
					return nil
				})
			}
			listeners[0].Ask("fg:api:{k1}")
			testutil.Eventually(t, "the others to hear it", func() error {
				for i := 1; i < 3; i++ {
					if got := names[i].got(); len(got) != 1 || got[0] != "fg:api:{k1}" {
						return fmt.Errorf("instance %d heard %q", i, got)
					}
				}
				return nil
			})
			listeners[2].Stop()
			listeners[1].Ask("fg:api:{k2}")
			testutil.Eventually(t, "instance 0 to hear it", func() error {
				if got := names[0].got(); len(got) != 1 || got[0] != "fg:api:{k2}" {
					return fmt.Errorf("instance 0 heard %q", got)
				}
				return nil
			})
			// Time for anything wrongly delivered to arrive.
			time.Sleep(50 * time.Millisecond)
			if got := names[1].got(); len(got) != 1 {
				t.Errorf("instance 1 heard %q: its own request included", got)
			}
			if got := names[2].got(); len(got) != 1 {
				t.Errorf("instance 2 heard %q after it stopped listening", got)
			}
			if got := other.got(); len(got) != 0 {
				t.Errorf("zone web heard zone api's requests: %q", got)
			}
		})
	}
}

// TestReclaimsReachOtherListenersOfTheProcess: several handlers of one
// process may serve a zone, each with its own leases, over one pooled
// Reclaims. A request reaches the process's other listeners as it reaches
// other processes' (once each), and never the listener that asked.
func TestReclaimsReachOtherListenersOfTheProcess(t *testing.T) {
	cfg := Config{Addresses: []string{redistest.Start(t).Addr()}}
	var recs [2]*Reclaims
	for i := range recs {
		r, err := NewReclaims(redisClient(t, cfg), ReclaimsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		recs[i] = r
	}
	var asker, sibling, elsewhere heard[string]
	a := recs[0].Listen("api", asker.add)
	defer a.Stop()
	defer recs[0].Listen("api", sibling.add).Stop()
	defer recs[1].Listen("api", elsewhere.add).Stop()
	for i, r := range recs {
		testutil.Eventually(t, fmt.Sprintf("process %d to listen", i), func() error {
			if !r.Listening("api") {
				return errors.New("not subscribed yet")
			}
			return nil
		})
	}
	a.Ask("fg:api:{k1}")
	testutil.Eventually(t, "the sibling and the other process to hear it", func() error {
		if got := sibling.got(); len(got) != 1 {
			return fmt.Errorf("the asker's sibling heard %q", got)
		}
		if got := elsewhere.got(); len(got) != 1 {
			return fmt.Errorf("the other process heard %q", got)
		}
		return nil
	})
	// Time for anything wrongly delivered (the asker, or the sibling
	// again through the channel) to arrive.
	time.Sleep(100 * time.Millisecond)
	if got := sibling.got(); len(got) != 1 {
		t.Errorf("the asker's sibling heard %q, want the request once", got)
	}
	if got := asker.got(); len(got) != 0 {
		t.Errorf("the asker heard its own request: %q", got)
	}
	a.Stop()
	a.Ask("fg:api:{k2}")
	time.Sleep(100 * time.Millisecond)
	if got := sibling.got(); len(got) != 1 {
		t.Errorf("a stopped listener asked: the sibling heard %q", got)
	}
}

package e2e

// Regions through process faults: the global redis-server killed and
// restarted (with its data, then once without), and one region's
// redis-server killed and restarted (soon, with its data; and after its
// pools' keys expired), under the four Caddy processes of startRegions.
// Every server keeps an append-only file fsynced before it answers
// (redistest.Persistent), so a kill loses nothing a client was told; a
// restart without data is a FLUSHALL before the kill. See
// docs/regions.md ("Failure modes") and docs/design.md ("Regions").

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// outageZone is a zone of the outage tests: a limit per hour on the key
// in the query's k, and the fail mode that applies while a Redis is away.
type outageZone struct {
	name, alg, fail string
	limit           int
}

// localLimit is the `fail local` zone's limit: small, so the limit each
// instance keeps alone while a Redis is away is reached within a burst.
const localLimit = 10

// outageZones are one zone per algorithm a region can share, failing
// closed, and a fixed window failing open and one failing local.
func outageZones() []outageZone {
	var zs []outageZone
	for _, alg := range regionAlgorithms {
		zs = append(zs, outageZone{name: alg, alg: alg, fail: "closed", limit: regionsLimit})
	}
	return append(zs,
		outageZone{name: "open", alg: "fixed_window", fail: "open", limit: regionsLimit},
		outageZone{name: "local", alg: "fixed_window", fail: "local", limit: localLimit})
}

// outageRoutes are the routes of zones.
func outageRoutes(zones []outageZone) []redisRoute {
	var rs []redisRoute
	for _, z := range zones {
		rs = append(rs, redisRoute{path: "/" + z.name, zone: fmt.Sprintf("key {query.k}\nalgorithm %s\nrate %d/1h\nfail %s", z.alg, z.limit, z.fail)})
	}
	return rs
}

// slack is what a token bucket zone refills in d (and a lifetime more,
// docs/regions.md): the admissions it may add to the limit over a run
// that long. Zero for the other algorithms, and for the bucket over runs
// shorter than a token's 36 s.
func (z outageZone) slack(d time.Duration) int {
	if z.alg != "token_bucket" {
		return 0
	}
	return int((d + time.Second).Seconds() * float64(z.limit) / 3600)
}

// regionBatch is the most one batch of z holds: ⌈region_quota × limit⌉
// (region_quota 0.1 in these tests).
func (z outageZone) regionBatch() int { return (z.limit + 9) / 10 }

// perZone runs f for every zone at once and returns the results by name.
func perZone[T any](zones []outageZone, f func(z outageZone) T) map[string]T {
	out := make(map[string]T, len(zones))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, z := range zones {
		wg.Go(func() {
			v := f(z)
			mu.Lock()
			out[z.name] = v
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// keyURLs are the URLs of key in zone on the instances given (all four
// when none).
func (s *regionsSetup) keyURLs(zone, key string, insts ...int) []string {
	urls := s.urls(zone, insts...)
	for i := range urls {
		urls[i] += "?k=" + url.QueryEscape(key)
	}
	return urls
}

// warmUp sends 8 requests for key to each zone over the four instances,
// so each region takes a batch of every zone, and checks all were
// admitted.
func (s *regionsSetup) warmUp(t *testing.T, c *http.Client, zones []outageZone, key string) map[string]burstResult {
	t.Helper()
	warm := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 8) })
	for _, z := range zones {
		if w := warm[z.name]; len(w.errs) > 0 || w.ok != 8 {
			t.Fatalf("%s, warm-up of %s: %d of 8 admitted (errors %v, other statuses %v)", z.name, key, w.ok, firstErr(w.errs), w.other)
		}
	}
	return warm
}

// inspectRegion is inspect's region member of key in zone on instance i,
// or why not; it may run on any goroutine.
func (s *regionsSetup) inspectRegion(i int, zone, key string) (regionReport, error) {
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := c.Get(s.insts[i].Admin() + "/rate_limit/zones/" + url.PathEscape(zone) + "?key=" + url.QueryEscape(key))
	if err != nil {
		return regionReport{}, err
	}
	defer resp.Body.Close()
	var st struct {
		Region *regionReport `json:"region"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK || st.Region == nil {
		return regionReport{}, fmt.Errorf("inspect %s %s on instance %d: %d (%v)", zone, key, i, resp.StatusCode, err)
	}
	return *st.Region, nil
}

// inspectRegions inspects key in every zone on one instance of each
// region given (instance 2r for region r), all at once: rs[zone][r] is
// region r's report (zero for a region not given).
func (s *regionsSetup) inspectRegions(t *testing.T, zones []outageZone, key string, regions ...int) map[string][2]regionReport {
	t.Helper()
	out := make(map[string][2]regionReport, len(zones))
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, z := range zones {
		for _, r := range regions {
			wg.Go(func() {
				rg, err := s.inspectRegion(2*r, z.name, key)
				mu.Lock()
				defer mu.Unlock()
				both := out[z.name]
				both[r] = rg
				out[z.name] = both
				if err != nil {
					errs = append(errs, err)
				}
			})
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	return out
}

// lapsesAfter is how soon after they were inspected the batches of
// regions rs lapse: the soonest and the latest. The soonest is zero when
// one had lapsed already (inspect then shows no units, though its pool may
// hold some until its janitor drains them).
func lapsesAfter(rs map[string][2]regionReport, regions ...int) (soonest, latest time.Duration) {
	soonest = time.Hour
	for _, both := range rs {
		for _, r := range regions {
			d := time.Duration(both[r].LapsesAfter * float64(time.Second))
			soonest, latest = min(soonest, d), max(latest, d)
		}
	}
	return soonest, latest
}

// resume sends requests for key to the zone on the four instances in
// turn until one is admitted, and reports how many were admitted (one)
// and how long it took; 503s (the fail mode while a client's breaker is
// still open) are what it waits out.
func (s *regionsSetup) resume(c *http.Client, zone, key string) (int, time.Duration, error) {
	start := time.Now()
	urls := s.keyURLs(zone, key)
	for i := 0; time.Since(start) < testutil.WaitLimit; i++ {
		r, err := send(c, http.MethodGet, urls[i%len(urls)])
		switch {
		case err != nil:
			return 0, 0, err
		case r.code == http.StatusOK:
			return 1, time.Since(start), nil
		case r.code != http.StatusServiceUnavailable:
			return 0, 0, fmt.Errorf("%s: answered %d while decisions resumed, want 503 then 200", zone, r.code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, 0, fmt.Errorf("%s: no request admitted within %v", zone, testutil.WaitLimit)
}

// wantFailMode checks burst d, sent to instances insts (each of region
// i/2) while a Redis they need was down: each region admits at most the
// units its pool could still spend (pool[r], zero when the region's own
// Redis is the one down), then the zone's fail mode applies: `closed`
// answers 503, `open` admits everything, `local` gives each instance the
// zone's limit alone (every instance gets more requests than that).
func wantFailMode(t *testing.T, what string, z outageZone, d burstResult, insts []int, pool [2]int64) {
	t.Helper()
	if len(d.errs) > 0 {
		t.Errorf("%s, %s: %d requests unanswered (first: %v)", z.name, what, len(d.errs), firstErr(d.errs))
	}
	n := d.ok + d.denied + len(d.other)
	switch z.fail {
	case "closed":
		var ok [2]int
		for j, i := range insts {
			ok[i/2] += d.okPerServer[j]
		}
		for r := range ok {
			if int64(ok[r]) > pool[r] {
				t.Errorf("%s, %s: region %d admitted %d, want at most the %d units its pool held", z.name, what, r, ok[r], pool[r])
			}
		}
		if d.denied > 0 || len(d.other) != n-d.ok {
			t.Errorf("%s, %s: %d admitted, %d refused (429), other statuses %v: want 503s (fail closed) once the pools' units are spent", z.name, what, d.ok, d.denied, d.other)
		}
		for _, code := range d.other {
			if code != http.StatusServiceUnavailable {
				t.Errorf("%s, %s: status %d, want 503 (fail closed)", z.name, what, code)
				break
			}
		}
	case "open":
		if d.ok != n {
			t.Errorf("%s, %s: %d of %d admitted (other statuses %v), want all (fail open)", z.name, what, d.ok, n, d.other)
		}
	case "local":
		for j, i := range insts {
			if ok := d.okPerServer[j]; ok < z.limit || int64(ok) > int64(z.limit)+pool[i/2] {
				t.Errorf("%s, %s: instance %d admitted %d, want its own limit %d plus at most the %d units its region's pool held (fail local)", z.name, what, i, ok, z.limit, pool[i/2])
			}
		}
		if len(d.other) > 0 {
			t.Errorf("%s, %s: statuses %v, want only 200 and 429 (fail local)", z.name, what, d.other)
		}
	}
}

// TestRegionsGlobalKilled: the global redis-server killed mid-run and
// restarted with its data. While it is down each region admits at most
// the units its pool holds, then the zone's fail mode applies. Once global
// is back, decisions resume, the idle units return, and every `fail
// closed` zone has admitted exactly its limit over the whole run, less
// the units the regions held and neither spent nor returned while global
// was down (none when the regions spend them all, as here). Then global
// restarted empty: it forgets its counts, and the same window admits the
// limit again.
func TestRegionsGlobalKilled(t *testing.T) {
	t.Parallel()
	const key = "g"
	zones := outageZones()
	s := startRegionsArgs(t, redistest.Persistent, outageRoutes(zones)...)
	c := newClient(t)
	awayFromBoundary(t, time.Hour, 2*time.Minute)
	began := time.Now()

	warm := s.warmUp(t, c, zones, key)
	inspected := time.Now()
	held := s.inspectRegions(t, zones, key, 0, 1)
	s.global.Kill()
	release := holdPort(t, s.global.Port()) // refused, and no one else's meanwhile
	killed := time.Now()
	// A batch that lapsed before the kill may have gone back to global;
	// one that had not is spent while global is down, or lost.
	lapse, _ := lapsesAfter(held, 0, 1)
	fresh := lapse > killed.Sub(inspected)

	down := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 60) })
	for _, z := range zones {
		h := held[z.name]
		wantFailMode(t, "global down", z, down[z.name], []int{0, 1, 2, 3}, [2]int64{h[0].Units, h[1].Units})
	}

	// Global back with its data: decisions resume.
	release()
	s.global.Restart()
	restarted := time.Now()
	admitted := map[string]int{}
	var counted []outageZone // zones whose every admission global counted
	for _, z := range zones {
		if z.fail == "closed" {
			counted = append(counted, z)
			admitted[z.name] = warm[z.name].ok + down[z.name].ok
		}
	}
	type resumed struct {
		ok   int
		took time.Duration
		err  error
	}
	res := perZone(counted, func(z outageZone) resumed {
		ok, took, err := s.resume(c, z.name, key)
		return resumed{ok, took, err}
	})
	for _, z := range counted {
		r := res[z.name]
		if r.err != nil {
			t.Fatal(r.err)
		}
		admitted[z.name] += r.ok
	}
	lastRefill := time.Now()
	if took := lastRefill.Sub(restarted); took > 5*time.Second {
		t.Errorf("decisions resumed %v after global's restart, want within 5s", took)
	}
	// The `fail open` zone is decided again in both regions: a decision
	// sets the rate-limit fields, which failing open leaves out.
	for _, i := range []int{0, 2} {
		testutil.Eventually(t, fmt.Sprintf("open decided on instance %d after global's restart", i), func() error {
			if r := get(t, c, s.keyURLs("open", key, i)[0]); r.code != http.StatusOK || !r.hasRateLimitHeaders() {
				return fmt.Errorf("answered %d with fields %v", r.code, r.header)
			}
			return nil
		})
	}

	// The idle units return. Global has the limit less what it counted:
	// the admissions, and the units the regions held and neither spent
	// nor returned while it was down, which stay counted until its window
	// ends.
	stranded := map[string]int{}
	for _, z := range counted {
		stranded[z.name] = int(held[z.name][0].Units+held[z.name][1].Units) - down[z.name].ok
	}
	remaining := map[string]int{}
	back := testutil.Within(t, "idle units back in global after its restart", 5*time.Second, func() error {
		rs := s.inspectRegions(t, counted, key, 0, 1)
		for _, z := range counted {
			rg := rs[z.name]
			if units := rg[0].Units + rg[1].Units; units != 0 {
				return fmt.Errorf("%s: the regions hold %d units", z.name, units)
			}
			want, g := z.limit-admitted[z.name]-stranded[z.name], int(rg[0].GlobalRemaining)
			if fresh && (g < want || g > want+z.slack(time.Since(began))) {
				return fmt.Errorf("%s: global has %d left, want %d (%d admitted, %d stranded)", z.name, g, want, admitted[z.name], stranded[z.name])
			}
			remaining[z.name] = g
		}
		if !fresh && time.Since(lastRefill) < 1500*time.Millisecond {
			return fmt.Errorf("waiting for the last refill's units")
		}
		return nil
	})
	if !fresh {
		t.Logf("a batch lapsed %v after the inspect, before the kill %v after it: the units stranded are bounded, not known", lapse, killed.Sub(inspected))
	}

	// Then the limit is reached exactly: every zone admits what global
	// has left, and no more than the limit over the whole run.
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	final := perZone(counted, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 150) })
	for _, z := range counted {
		f, slack := final[z.name], z.slack(time.Since(began))
		f.wantAnswered(t, z.name+", after global's restart")
		total, want := admitted[z.name]+f.ok, z.limit-stranded[z.name]
		t.Logf("%s: %d admitted before the kill, %d while global was down (the regions held %d+%d, %d stranded), %d once it was back; %d in all",
			z.name, warm[z.name].ok, down[z.name].ok, held[z.name][0].Units, held[z.name][1].Units, stranded[z.name], admitted[z.name]-warm[z.name].ok-down[z.name].ok+f.ok, total)
		if g := remaining[z.name]; f.ok < g || f.ok > g+slack {
			t.Errorf("%s: %d admitted once the idle units were back, want the %d global had left", z.name, f.ok, g)
		}
		if total > z.limit+slack || (fresh && (total < want || total > want+slack)) || total < want-2*z.regionBatch() {
			t.Errorf("%s: %d admitted over the run, want %d (the limit less %d units stranded while global was down)", z.name, total, want, stranded[z.name])
		}
	}
	t.Logf("global killed %v after the inspect (the first batch lapsed %v after it); decisions resumed %v after the restart; idle units back %v after that",
		killed.Sub(inspected).Round(time.Millisecond), lapse.Round(time.Millisecond), lastRefill.Sub(restarted).Round(time.Millisecond), back.Round(time.Millisecond))

	// Global restarted empty (FLUSHALL reaches its append-only file, then
	// the kill): it forgets what it counted, and the window that admitted
	// the limit admits it again.
	const zone = "fixed_window"
	redisReply(t, s.global, "FLUSHALL", func(ctx context.Context) (string, error) { return s.global.Client(t).FlushAll(ctx).Result() })
	s.global.Kill()
	s.global.Restart()
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	first, _, err := s.resume(c, zone, key)
	if err != nil {
		t.Fatal(err)
	}
	again := burst(c, s.keyURLs(zone, key), 300)
	again.wantAnswered(t, zone+", global restarted empty")
	if n := first + again.ok; n != regionsLimit {
		t.Errorf("%s: %d admitted after global restarted empty, want the limit, %d, again", zone, n, regionsLimit)
	}
}

// regionalReturnBound is how long after a batch lapses its units are back
// in global when its region is up: a janitor's tick (250ms) and the
// return's round trip (60ms), with room. Not more: a region restarted
// with its data must drain its pools before their keys expire, three
// seconds after the lapse.
const regionalReturnBound = 500 * time.Millisecond

// poolKeyLife is how long after a batch lapses its pool's key in the
// regional Redis expires: two lifetimes and a second (lua/pool_fill.lua),
// with room.
const poolKeyLife = 3300 * time.Millisecond

// TestRegionsRegionKilled: region 1's redis-server killed mid-run, twice.
//
// Restarted soon with its data: its units stay counted in global while
// the server is down, past their lifetime; once it is back, its
// instances return them (drained from the lapsed batches) and region 0
// takes them.
//
// Kept down: region 1's instances apply each zone's fail mode, and region
// 0 decides exactly, from what global has left less the units region 1
// held. Restarted after its pools' keys expired (as one restarted empty):
// region 1 decides again, and the units it held stay counted in global
// until its window ends.
func TestRegionsRegionKilled(t *testing.T) {
	t.Parallel()
	zones := outageZones()
	s := startRegionsArgs(t, redistest.Persistent, outageRoutes(zones)...)
	c := newClient(t)
	awayFromBoundary(t, time.Hour, 2*time.Minute)
	began := time.Now()

	// Restarted soon, with its data.
	key := "soon"
	warm := s.warmUp(t, c, zones, key)
	inspected := time.Now()
	held := s.inspectRegions(t, zones, key, 0, 1)
	inspectDone := time.Now()
	s.regions[1].Kill()
	release := holdPort(t, s.regions[1].Port())
	killed := time.Now()
	lapse, lastLapse := lapsesAfter(held, 0, 1)
	fresh := lapse > killed.Sub(inspected)
	time.Sleep(time.Until(inspectDone.Add(lastLapse + regionalReturnBound)))
	stuck := s.inspectRegions(t, zones, key, 0)
	for _, z := range zones {
		// Region 0's units are back by now; region 1's are in its pool.
		want := z.limit - warm[z.name].ok - int(held[z.name][1].Units)
		if g := int(stuck[z.name][0].GlobalRemaining); fresh && g > want+z.slack(time.Since(began)) {
			t.Errorf("%s, region 1 down: global has %d left a lifetime and a return after the batches lapsed, want at most %d: region 1's %d units are in its server", z.name, g, want, held[z.name][1].Units)
		}
	}
	release()
	s.regions[1].Restart()
	restarted := time.Now()
	back := testutil.Within(t, "region 1's units back in global after its restart", 5*time.Second, func() error {
		rs := s.inspectRegions(t, zones, key, 0)
		for _, z := range zones {
			want := z.limit - warm[z.name].ok
			if g := int(rs[z.name][0].GlobalRemaining); g < want || g > want+z.slack(time.Since(began)) {
				return fmt.Errorf("%s: global has %d left, want %d", z.name, g, want)
			}
		}
		return nil
	})
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	taken := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 0, 1), 150) })
	for _, z := range zones {
		a := taken[z.name]
		a.wantAnswered(t, z.name+", region 0 after region 1's restart")
		if want, slack := z.limit-warm[z.name].ok, z.slack(time.Since(began)); a.ok < want || a.ok > want+slack {
			t.Errorf("%s: region 0 admitted %d after region 1's units came back, want all %d global had left", z.name, a.ok, want)
		}
	}
	t.Logf("restarted soon: region 1 killed %v after the inspect (the first batch lapsed %v after it), restarted %v after the kill; its units back in global %v after the restart",
		killed.Sub(inspected).Round(time.Millisecond), lapse.Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond), back.Round(time.Millisecond))

	// Kept down.
	key = "later"
	warm = s.warmUp(t, c, zones, key)
	inspected = time.Now()
	held = s.inspectRegions(t, zones, key, 1)
	inspectDone = time.Now()
	s.regions[1].Kill()
	release = holdPort(t, s.regions[1].Port())
	killed = time.Now()
	lapse, lastLapse = lapsesAfter(held, 1)
	fresh = lapse > killed.Sub(inspected)

	cut := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 2, 3), 30) })
	for _, z := range zones {
		wantFailMode(t, "region 1 down", z, cut[z.name], []int{2, 3}, [2]int64{})
	}
	admitted := map[string]int{}
	alone := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 0, 1), 150) })
	for _, z := range zones {
		a := alone[z.name]
		a.wantAnswered(t, z.name+", region 0 with region 1 down")
		admitted[z.name] = warm[z.name].ok + a.ok
		// Unless fresh, a batch of region 1 lapsed before the kill: its
		// units went back to global (and region 0), or are stranded in
		// the dead server though inspect showed none.
		held1, slack := int(held[z.name][1].Units), z.slack(time.Since(began))
		want := z.limit - warm[z.name].ok - held1
		if a.ok > want+held1+slack || (fresh && (a.ok < want || a.ok > want+slack)) || a.ok < want-z.regionBatch() {
			t.Errorf("%s, region 1 down: region 0 admitted %d, want %d: the %d global had left less the %d units region 1 held", z.name, a.ok, want, z.limit-warm[z.name].ok, held1)
		}
	}

	// Restarted after its pools' keys expired: region 1 decides again,
	// and what it held stays counted.
	time.Sleep(time.Until(inspectDone.Add(lastLapse + poolKeyLife)))
	release()
	s.regions[1].Restart()
	time.Sleep(regionalReturnBound + denyCacheDefault)
	final := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 100) })
	for _, z := range zones {
		f := final[z.name]
		total, held1, slack := admitted[z.name]+f.ok, int(held[z.name][1].Units), z.slack(time.Since(began))
		t.Logf("%s, region 1 kept down: %d admitted before the kill (region 1 held %d), %d by region 0 alone, %d once region 1 was back; %d counted in all",
			z.name, warm[z.name].ok, held1, alone[z.name].ok, f.ok, total)
		// Decided again in region 1: refusals, no fail mode.
		f.wantAnswered(t, z.name+", region 1 restarted without its pools")
		if want := z.limit - held1; total > z.limit+slack || (fresh && (total < want || total > want+slack)) {
			t.Errorf("%s: %d admitted over the run (not counting region 1's fail mode), want %d: the limit less the %d units region 1 held when it died", z.name, total, want, held1)
		}
	}
}

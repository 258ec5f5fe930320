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
	"math"
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

// lateCut is what a token bucket's batch returned d after it lapsed
// goes back less (limiter/regional's late rest, docs/regions.md): the
// tokens the bucket refilled meanwhile, rounded up, so a rest held in a
// stopped region comes back a unit short. Zero for the other algorithms.
func (z outageZone) lateCut(d time.Duration) int {
	if z.alg != "token_bucket" {
		return 0
	}
	return int(math.Ceil(d.Seconds() * float64(z.limit) / 3600))
}

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

// moved is what a region's instances counted of a zone's units
// (caddy_http_rate_limit_global_units_total): taken from global in their
// refills, and returned to it.
type moved struct{ taken, returned int }

// unitsMoved reads every instance's metrics: m[zone][r] is what region
// r's two instances counted of zone's units, over every key.
func (s *regionsSetup) unitsMoved(t *testing.T, c *http.Client, zones []outageZone) map[string][2]moved {
	t.Helper()
	out := make(map[string][2]moved, len(zones))
	for i, inst := range s.insts {
		series := rateLimitSeries(t, c, inst)
		for _, z := range zones {
			var taken, returned float64
			fmt.Sscan(series[fmt.Sprintf(`caddy_http_rate_limit_global_units_total{movement="taken",zone=%q}`, z.name)], &taken)
			fmt.Sscan(series[fmt.Sprintf(`caddy_http_rate_limit_global_units_total{movement="returned",zone=%q}`, z.name)], &returned)
			m := out[z.name]
			m[i/2].taken += int(taken)
			m[i/2].returned += int(returned)
			out[z.name] = m
		}
	}
	return out
}

// held is the units region r took from global for zone since before,
// less those it returned and those it admitted (admitted[r]): what its
// pool holds, or lost when a return failed.
func held(before, now map[string][2]moved, zone string, r, admitted int) int {
	b, n := before[zone][r], now[zone][r]
	return n.taken - b.taken - (n.returned - b.returned) - admitted
}

// okIn is what region r's instances admitted of a burst sent to all four
// (s.urls order: instances 2r and 2r+1).
func okIn(d burstResult, r int) int { return d.okPerServer[2*r] + d.okPerServer[2*r+1] }

// lapsedAndDrained is how long after its refill every batch has lapsed
// (a lifetime) and its janitor has drained it (a quarter lifetime), with
// room for a loaded machine.
const lapsedAndDrained = 1500 * time.Millisecond

// resume sends requests for key to the zone on the four instances in
// turn until one is admitted (one admission, which the caller counts);
// 503s (the fail mode while a client's breaker is still open) are what
// it waits out.
func (s *regionsSetup) resume(c *http.Client, zone, key string) error {
	start := time.Now()
	urls := s.keyURLs(zone, key)
	for i := 0; time.Since(start) < testutil.WaitLimit; i++ {
		r, err := send(c, http.MethodGet, urls[i%len(urls)])
		switch {
		case err != nil:
			return err
		case r.code == http.StatusOK:
			return nil
		case r.code != http.StatusServiceUnavailable:
			return fmt.Errorf("%s: answered %d while decisions resumed, want 503 then 200", zone, r.code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: no request admitted within %v", zone, testutil.WaitLimit)
}

// wantFailMode checks burst d, sent to instances insts (each of region
// i/2) while a Redis they need was down: each region admits at most the
// units its pool could still spend (pool[r], zero when the region's own
// Redis is the one down), then the zone's fail mode applies: `closed`
// answers 503, `open` admits everything, `local` gives each instance the
// zone's limit alone (every instance gets more requests than that).
func wantFailMode(t *testing.T, what string, z outageZone, d burstResult, insts []int, pool [2]int) {
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
			if ok[r] > pool[r] {
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
			if ok := d.okPerServer[j]; ok < z.limit || ok > z.limit+pool[i/2] {
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
// is back, decisions resume, the idle units return, global's count is
// what the instances took less what they returned, and every `fail
// closed` zone admits exactly what global has left: the limit over the
// whole run, less the units the regions held and could not spend before
// their lifetime ended (their return failed; they stay counted until
// global's window ends). Then global restarted empty: it forgets its
// counts, and the same window admits the limit again.
func TestRegionsGlobalKilled(t *testing.T) {
	t.Parallel()
	const key = "g"
	zones := outageZones()
	s := startRegionsArgs(t, redistest.Persistent, outageRoutes(zones)...)
	c := newClient(t)
	awayFromBoundary(t, time.Hour, 2*time.Minute)
	began := time.Now()

	before := s.unitsMoved(t, c, zones)
	warm := s.warmUp(t, c, zones, key)
	s.global.Kill()
	release := holdPort(t, s.global.Port()) // refused, and no one else's meanwhile
	killed := time.Now()
	down := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 60) })
	// Every batch lapses and is drained while global is down: what the
	// regions took and neither admitted nor returned by then is lost.
	time.Sleep(time.Until(killed.Add(lapsedAndDrained)))
	atKill := s.unitsMoved(t, c, zones) // nothing moves while global is down
	pools := map[string][2]int{}
	for _, z := range zones {
		p := [2]int{held(before, atKill, z.name, 0, okIn(warm[z.name], 0)), held(before, atKill, z.name, 1, okIn(warm[z.name], 1))}
		pools[z.name] = p
		wantFailMode(t, "global down", z, down[z.name], []int{0, 1, 2, 3}, p)
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
	res := perZone(counted, func(z outageZone) error { return s.resume(c, z.name, key) })
	for _, z := range counted {
		if err := res[z.name]; err != nil {
			t.Fatal(err)
		}
		admitted[z.name]++
	}
	resumedAfter := time.Since(restarted)
	if resumedAfter > 5*time.Second {
		t.Errorf("decisions resumed %v after global's restart, want within 5s", resumedAfter)
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

	// The idle units return: the regions hold none, and global has the
	// limit less what the instances took and did not return. What they
	// took and neither admitted nor returned is stranded: at most what the
	// regions held and did not spend while global was down.
	resumedAt := time.Now()
	time.Sleep(lapsedAndDrained)
	remaining, stranded := map[string]int{}, map[string]int{}
	testutil.Within(t, "idle units back in global after its restart", 5*time.Second, func() error {
		rs := s.inspectRegions(t, counted, key, 0, 1)
		now := s.unitsMoved(t, c, counted)
		for _, z := range counted {
			rg := rs[z.name]
			if units := rg[0].Units + rg[1].Units; units != 0 {
				return fmt.Errorf("%s: the regions hold %d units", z.name, units)
			}
			kept := held(before, now, z.name, 0, 0) + held(before, now, z.name, 1, 0) // taken, not returned
			want, g := z.limit-kept, int(rg[0].GlobalRemaining)
			if g < want || g > want+z.slack(time.Since(began)) {
				return fmt.Errorf("%s: global has %d left, want %d: the limit less the %d units the instances took and did not return", z.name, g, want, kept)
			}
			unspent := pools[z.name][0] + pools[z.name][1] - down[z.name].ok
			if lost := kept - admitted[z.name]; lost < 0 || lost > unspent {
				return fmt.Errorf("%s: %d units taken and neither admitted nor returned, want at most the %d the regions held and did not spend while global was down", z.name, lost, unspent)
			}
			remaining[z.name], stranded[z.name] = g, kept-admitted[z.name]
		}
		return nil
	})
	back := time.Since(resumedAt)

	// Then the limit is reached exactly: every zone admits what global
	// has left. Over the run that is the limit, less the units stranded
	// while global was down: at most what the regions held and did not
	// spend then.
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	final := perZone(counted, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 150) })
	for _, z := range counted {
		f, p, slack := final[z.name], pools[z.name], z.slack(time.Since(began))
		f.wantAnswered(t, z.name+", after global's restart")
		total := admitted[z.name] + f.ok
		t.Logf("%s: %d admitted before the kill, %d while global was down (the regions held %d+%d), %d once it was back; %d in all, %d stranded",
			z.name, warm[z.name].ok, down[z.name].ok, p[0], p[1], admitted[z.name]-warm[z.name].ok-down[z.name].ok+f.ok, total, stranded[z.name])
		if g := remaining[z.name]; f.ok < g || f.ok > g+slack {
			t.Errorf("%s: %d admitted once the idle units were back, want the %d global had left", z.name, f.ok, g)
		}
		if total > z.limit+slack {
			t.Errorf("%s: %d admitted over the run, want at most %d", z.name, total, z.limit)
		}
	}
	t.Logf("global down %v; decisions resumed %v after the restart; idle units back %v after that (%v waited)",
		restarted.Sub(killed).Round(time.Millisecond), resumedAfter.Round(time.Millisecond), back.Round(time.Millisecond), lapsedAndDrained)

	// Global restarted empty (FLUSHALL reaches its append-only file, then
	// the kill): it forgets what it counted, and the window that admitted
	// the limit admits it again.
	const zone = "fixed_window"
	redisReply(t, s.global, "FLUSHALL", func(ctx context.Context) (string, error) { return s.global.Client(t).FlushAll(ctx).Result() })
	s.global.Kill()
	s.global.Restart()
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	if err := s.resume(c, zone, key); err != nil {
		t.Fatal(err)
	}
	again := burst(c, s.keyURLs(zone, key), 300)
	again.wantAnswered(t, zone+", global restarted empty")
	if n := 1 + again.ok; n != regionsLimit {
		t.Errorf("%s: %d admitted after global restarted empty, want the limit, %d, again", zone, n, regionsLimit)
	}
}

// returnedAfter is how soon after a batch lapses its units are back in
// global when its region is up: a janitor's tick (250ms) and the
// return's round trip (60ms), with a little room. Not more: a region
// restarted with its data must drain its pools before their keys expire
// (poolKeyLife).
const returnedAfter = 350 * time.Millisecond

// poolKeyLife is how long after a batch lapses its pool's key in the
// regional Redis expires: two lifetimes and a second (lua/pool_fill.lua),
// with room.
const poolKeyLife = 3300 * time.Millisecond

// TestRegionsRegionKilled: region 1's redis-server killed mid-run, twice.
//
// Restarted soon with its data: its units stay counted in global while
// the server is down, past their lifetime; once it is back, its
// instances drain the lapsed batches and return them, and region 0 takes
// them.
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
	before := s.unitsMoved(t, c, zones)
	warm := s.warmUp(t, c, zones, key)
	s.regions[1].Kill()
	release := holdPort(t, s.regions[1].Port())
	killed := time.Now()
	// Every batch has lapsed a lifetime after the kill, and been returned
	// a janitor's tick later, if its region is up: region 0's units come
	// back, region 1's stay in its server.
	time.Sleep(time.Until(killed.Add(time.Second + returnedAfter)))
	atKill := s.unitsMoved(t, c, zones) // region 1's instances move nothing now
	stuck := testutil.Within(t, "region 0's units back in global, region 1's not", time.Second, func() error {
		rs := s.inspectRegions(t, zones, key, 0)
		for _, z := range zones {
			held1 := held(before, atKill, z.name, 1, okIn(warm[z.name], 1))
			want := z.limit - warm[z.name].ok - held1
			if g := int(rs[z.name][0].GlobalRemaining); g < want || g > want+z.slack(time.Since(began)) {
				return fmt.Errorf("%s: global has %d left, want %d: the limit less the %d admitted and the %d units in region 1's server", z.name, g, want, warm[z.name].ok, held1)
			}
		}
		return nil
	})
	release()
	s.regions[1].Restart()
	restarted := time.Now()
	back := testutil.Within(t, "region 1's units back in global after its restart", 5*time.Second, func() error {
		rs := s.inspectRegions(t, zones, key, 0)
		for _, z := range zones {
			// Region 1's rests come back late, so a bucket's a little short.
			want, cut := z.limit-warm[z.name].ok, z.lateCut(time.Since(killed))
			if g := int(rs[z.name][0].GlobalRemaining); g < want-cut || g > want+z.slack(time.Since(began)) {
				return fmt.Errorf("%s: global has %d left, want %d (at least %d)", z.name, g, want, want-cut)
			}
		}
		return nil
	})
	time.Sleep(denyCacheDefault + 10*time.Millisecond)
	taken := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 0, 1), 150) })
	for _, z := range zones {
		a := taken[z.name]
		a.wantAnswered(t, z.name+", region 0 after region 1's restart")
		if want, slack := z.limit-warm[z.name].ok, z.slack(time.Since(began)); a.ok < want-z.lateCut(time.Since(killed)) || a.ok > want+slack {
			t.Errorf("%s: region 0 admitted %d after region 1's units came back, want all %d global had left", z.name, a.ok, want)
		}
	}
	t.Logf("restarted soon: region 1's units still out %v after the kill; restarted %v after the kill, its units back in global %v after that",
		(time.Second + returnedAfter + stuck).Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond), back.Round(time.Millisecond))

	// Kept down.
	key = "later"
	before = s.unitsMoved(t, c, zones)
	warm = s.warmUp(t, c, zones, key)
	s.regions[1].Kill()
	release = holdPort(t, s.regions[1].Port())
	killed = time.Now()

	cut := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 2, 3), 30) })
	for _, z := range zones {
		wantFailMode(t, "region 1 down", z, cut[z.name], []int{2, 3}, [2]int{})
	}
	admitted := map[string]int{}
	alone := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key, 0, 1), 150) })
	atKill = s.unitsMoved(t, c, zones) // region 1's, as they were at the kill
	for _, z := range zones {
		a := alone[z.name]
		a.wantAnswered(t, z.name+", region 0 with region 1 down")
		admitted[z.name] = warm[z.name].ok + a.ok
		held1 := held(before, atKill, z.name, 1, okIn(warm[z.name], 1))
		if want, slack := z.limit-warm[z.name].ok-held1, z.slack(time.Since(began)); a.ok < want || a.ok > want+slack {
			t.Errorf("%s, region 1 down: region 0 admitted %d, want %d: the %d global had left less the %d units region 1 held", z.name, a.ok, want, z.limit-warm[z.name].ok, held1)
		}
	}

	// Restarted after its pools' keys expired: region 1 decides again,
	// and what it held stays counted.
	time.Sleep(time.Until(killed.Add(time.Second + poolKeyLife)))
	release()
	s.regions[1].Restart()
	time.Sleep(lapsedAndDrained)
	final := perZone(zones, func(z outageZone) burstResult { return burst(c, s.keyURLs(z.name, key), 100) })
	for _, z := range zones {
		f := final[z.name]
		held1, slack := held(before, atKill, z.name, 1, okIn(warm[z.name], 1)), z.slack(time.Since(began))
		total := admitted[z.name] + f.ok
		t.Logf("%s, region 1 kept down: %d admitted before the kill (region 1 held %d), %d by region 0 alone, %d once region 1 was back; %d counted in all",
			z.name, warm[z.name].ok, held1, alone[z.name].ok, f.ok, total)
		// Decided again in region 1: refusals, no fail mode.
		f.wantAnswered(t, z.name+", region 1 restarted without its pools")
		if want := z.limit - held1; total < want || total > want+slack {
			t.Errorf("%s: %d admitted over the run (not counting region 1's fail mode), want %d: the limit less the %d units region 1 held when it died", z.name, total, want, held1)
		}
	}
}

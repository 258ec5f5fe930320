package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
	_ "time/tzdata" // the candidate zones below, whatever the host has

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// calendarZone picks a time zone whose local midnight is at least an hour
// away, so a test's day does not end while it runs, and says when its
// current day began and ends.
func calendarZone(t *testing.T) (name string, start, end time.Time) {
	t.Helper()
	for _, name := range []string{"Europe/Berlin", "America/New_York", "Asia/Tokyo", "Pacific/Honolulu"} {
		loc := testutil.MustLoad(t, name)
		now := time.Now().In(loc)
		start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, loc)
		end := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, loc)
		if time.Until(end) >= time.Hour {
			return name, start, end
		}
	}
	t.Fatal("no candidate time zone is an hour from midnight") // they are hours apart
	return "", time.Time{}, time.Time{}
}

// TestCalendarDay: a `calendar day <zone>` zone, in memory and in Redis,
// admits its events per local day and then refuses, and its headers count
// down to the local midnight of the configured time zone: X-RateLimit-Reset
// is that midnight, RateLimit's t and Retry-After the seconds until it,
// and RateLimit-Policy's w the length of the current local day, as
// rate_limit_status says too. The Redis zone's key lives until that
// midnight.
func TestCalendarDay(t *testing.T) {
	t.Parallel()
	tz, start, end := calendarZone(t)
	srv := redistest.Start(t)
	zone := func(name, store string) string {
		return fmt.Sprintf(`
	handle /%[1]s {
		rate_limit {
			zone %[1]s {
				key header X-Client
				events 3
				calendar day %[2]s
				store %[3]s
			}
			redis {
				url redis://%[4]s
				timeout %[5]s
			}
		}
		respond "ok"
	}`, name, tz, store, srv.Addr(), redisTimeout)
	}
	status := "\n\thandle /status {\n\t\trate_limit_status\n\t}"
	inst := caddyproc.Start(t, globals+"\nhttp://{{http}} {"+zone("cal_memory", "memory")+zone("cal_redis", "redis")+status+"\n}\n")
	c := newClient(t)
	day := int64(end.Sub(start) / time.Second)
	for _, name := range []string{"cal_memory", "cal_redis"} {
		t.Run(name, func(t *testing.T) {
			url := inst.URL("/" + name)
			rs := expectCodes(t, name, c, url, []int{200, 200, 200, 429}, clientHeader("calendar-client")...)
			wantRemaining(t, name, rs[:3], name, 2, 1, 0)
			for i, r := range rs {
				if got := intHeader(t, r, "X-RateLimit-Reset"); got != end.Unix() {
					t.Errorf("response %d: X-RateLimit-Reset %d, want %d (midnight in %s, %s)", i+1, got, end.Unix(), tz, end)
				}
				left := int64(time.Until(end)/time.Second) + 1
				if tp := intParam(t, zoneParams(t, r, "RateLimit", name), "t"); tp < left-5 || tp > left+5 {
					t.Errorf("response %d: RateLimit t=%d, want about %d, the seconds to midnight in %s", i+1, tp, left, tz)
				}
				policy := zoneParams(t, r, "RateLimit-Policy", name)
				if q, w := intParam(t, policy, "q"), intParam(t, policy, "w"); q != 3 || w != day {
					t.Errorf("response %d: RateLimit-Policy q=%d w=%d, want q=3 w=%d (today in %s)", i+1, q, w, day, tz)
				}
			}
			left := int64(time.Until(end)/time.Second) + 1
			checkDenial(t, rs[3], name, left-5, left+5)
			// Another client has a day of its own.
			expectCodes(t, name+" other client", c, url, []int{200}, clientHeader("other-client")...)
		})
	}
	// The client's own status: a day's window, and the reset at midnight.
	var st struct {
		Zones []struct {
			Zone                            string
			Limit, Remaining, Reset, Window int64
		}
	}
	r := get(t, c, inst.URL("/status"), clientHeader("calendar-client")...)
	if err := json.Unmarshal([]byte(r.body), &st); err != nil || len(st.Zones) != 2 {
		t.Fatalf("rate_limit_status: %d %q (%v), want both zones", r.code, r.body, err)
	}
	for _, z := range st.Zones {
		left := int64(time.Until(end)/time.Second) + 1
		if z.Limit != 3 || z.Remaining != 0 || z.Window != day || z.Reset < left-5 || z.Reset > left+5 {
			t.Errorf("rate_limit_status for %s: %+v, want limit 3, remaining 0, window %d, reset about %d", z.Zone, z, day, left)
		}
	}
	keys, err := srv.Client(t).Keys(context.Background(), "floodgate:cal_redis:{*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys of cal_redis: %v, %v; want one per client", keys, err)
	}
	ttl := redisReply(t, srv, "PTTL", func(ctx context.Context) (time.Duration, error) {
		return srv.Client(t).PTTL(ctx, keys[0]).Result()
	})
	if left := time.Until(end); ttl < left-5*time.Second || ttl > left+5*time.Second {
		t.Errorf("key %s lives %v more, want until midnight in %s, %v away", keys[0], ttl, tz, left)
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

// TestExampleCalendarQuota runs examples/calendar-quota.Caddyfile, which
// docs/shaped-limits.md ("Calendar quotas") shows, as written: each API key is
// counted per calendar month of its customer's time zone, on its plan, and
// a request without a key is refused.
func TestExampleCalendarQuota(t *testing.T) {
	t.Parallel()
	upstream := newLoopbackServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	inst := startExample(t, "calendar-quota.Caddyfile", upstream)
	c := newClient(t)
	for _, tc := range []struct {
		key, zone, tz string
		quota         int64
	}{
		{"key-acme", "monthly_eu", "Europe/Berlin", 1_000_000},
		{"key-initech", "monthly_us", "America/New_York", 10_000},
		{"key-unknown", "monthly_eu", "Europe/Berlin", 10_000},
	} {
		loc := testutil.MustLoad(t, tc.tz)
		before := time.Now().In(loc)
		r := get(t, c, inst.URL("/"), "X-API-Key", tc.key)
		after := time.Now().In(loc)
		if r.code != 200 {
			t.Fatalf("%s: status %d", tc.key, r.code)
		}
		// The month the request was decided in: the one it was sent in,
		// unless the next began before the answer came.
		month := func(now time.Time) (time.Time, time.Time) {
			return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, loc), time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, loc)
		}
		start, end := month(before)
		if intHeader(t, r, "X-RateLimit-Reset") != end.Unix() {
			start, end = month(after)
		}
		policy := zoneParams(t, r, "RateLimit-Policy", tc.zone)
		if q, w := intParam(t, policy, "q"), intParam(t, policy, "w"); q != tc.quota || w != int64(end.Sub(start)/time.Second) {
			t.Errorf("%s: RateLimit-Policy %q, want q=%d w=%d (this month in %s)", tc.key, r.header.Get("RateLimit-Policy"), tc.quota, int64(end.Sub(start)/time.Second), tc.tz)
		}
		if got := intHeader(t, r, "X-RateLimit-Reset"); got != end.Unix() {
			t.Errorf("%s: X-RateLimit-Reset %d, want %d (the 1st of next month in %s)", tc.key, got, end.Unix(), tc.tz)
		}
		if got := intHeader(t, r, "X-RateLimit-Remaining"); got != tc.quota-1 {
			t.Errorf("%s: X-RateLimit-Remaining %d, want %d", tc.key, got, tc.quota-1)
		}
	}
	if r := get(t, c, inst.URL("/")); r.code != 429 {
		t.Errorf("a request without an API key: status %d, want 429 (missing_key deny)", r.code)
	}
	if t.Failed() {
		t.Logf("caddy log:\n%s", inst.Log())
	}
}

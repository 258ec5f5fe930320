package ratelimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestCaddyfileCalendar: `calendar` sets the zone's calendar, makes a zone
// without an algorithm a fixed window, and a tier's <n>/month is a period.
func TestCaddyfileCalendar(t *testing.T) {
	h, err := parseDirective(t, `rate_limit {
		zone monthly {
			key {http.request.header.X-API-Key}
			events 10000
			calendar month America/New_York
			tier {http.request.header.X-Plan} {
				pro 1000000/month
				trial 100/day
			}
		}
		zone daily {
			algorithm fixed_window
			events 5
			calendar day
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(h.RateLimits["monthly"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"calendar":{"period":"month","time_zone":"America/New_York"}`,
		`"pro":{"max_events":1000000,"period":"month"}`,
		`"trial":{"max_events":100,"period":"day"}`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("zone JSON %s lacks %s", got, want)
		}
	}
	p := h.RateLimits["monthly"].policy()
	if p.Algorithm != limiter.FixedWindow || p.Calendar == nil || p.Calendar.Location.String() != "America/New_York" || p.Window != 0 {
		t.Errorf("policy %+v: want a fixed window over New York's months", p)
	}
	tp := tierPolicy(p, h.RateLimits["monthly"].Tier.Limits["trial"])
	if tp.Events != 100 || tp.Calendar.Period != limiter.Day || tp.Calendar.Location != p.Calendar.Location {
		t.Errorf("trial tier policy %s: want 100 per day in New York", tp)
	}
	if c := h.RateLimits["daily"].policy().Calendar; c == nil || c.String() != "day@UTC" {
		t.Errorf("daily zone's calendar %v, want day@UTC", c)
	}
}

// TestCaddyfileCalendarRefusals: a calendar is refused, with the zone and
// the line, beside a window or a rate, on another algorithm, with a
// period or a time zone the limiter does not know, and so are tiers whose
// window is not of the zone's kind.
func TestCaddyfileCalendarRefusals(t *testing.T) {
	zone := func(lines ...string) string {
		return "rate_limit {\n zone a {\n  " + strings.Join(lines, "\n  ") + "\n }\n}"
	}
	runParseErrorCases(t, []parseErrorCase{
		{"window then calendar", zone("events 5", "window 1h", "calendar day"), []string{"zone a: option 'calendar': cannot be used together with window", ":5"}},
		{"calendar then window", zone("events 5", "calendar day", "window 1h"), []string{"zone a: option 'window': cannot be used together with calendar", ":5"}},
		{"rate then calendar", zone("rate 5/h", "calendar day"), []string{"zone a: option 'calendar': cannot be used together with window or rate", ":4"}},
		{"calendar then rate", zone("calendar day", "rate 5/h"), []string{"zone a: option 'rate': cannot be used together with calendar", ":4"}},
		{"token bucket", zone("algorithm token_bucket", "events 5", "calendar day"), []string{"zone a: a calendar applies only to fixed_window, not token_bucket", ":2"}},
		{"sliding counter", zone("algorithm sliding_window_counter", "events 5", "calendar week"), []string{"zone a: ", "fixed_window", ":2"}},
		{"unknown period", zone("events 5", "calendar fortnight"), []string{"zone a: option 'calendar': unknown calendar period \"fortnight\"", ":4"}},
		{"unknown time zone", zone("events 5", "calendar day Europe/Berln"), []string{"zone a: option 'calendar': unknown time zone \"Europe/Berln\"", ":4"}},
		{"local time zone", zone("events 5", "calendar day Local"), []string{"zone a: option 'calendar': ", "Local", ":4"}},
		{"no period", zone("events 5", "calendar"), []string{"zone a: option 'calendar' takes day | week | month [<time zone>]", ":4"}},
		{"too many", zone("events 5", "calendar day UTC now"), []string{"zone a: option 'calendar' takes", ":4"}},
		{"no events", zone("calendar day"), []string{"zone a: ", "events must be positive", ":2"}},
		{"tier with a duration", zone("events 5", "calendar month", "tier {plan} {\n   pro 100/1h\n  }"), []string{`zone a: tier "pro": a calendar zone's tiers count per calendar day, week or month: write <n>/month`, ":2"}},
		{"tier with a period", zone("rate 5/h", "tier {plan} {\n   pro 100/month\n  }"), []string{`zone a: tier "pro": a period (month) needs a calendar zone`, ":2"}},
		{"tier period events", zone("events 5", "calendar month", "tier {plan} {\n   pro x/month\n  }"), []string{"zone a: option 'tier': value 'pro': events must be a positive integer", ":6"}},
	})
}

// TestCalendarJSONRefusals: a JSON config is refused as the Caddyfile is.
func TestCalendarJSONRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		zone Zone
		want string
	}{
		"window and calendar": {Zone{MaxEvents: 5, Window: caddy.Duration(time.Hour), Calendar: &CalendarConfig{Period: "day"}}, "calendar replaces window"},
		"bad period":          {Zone{MaxEvents: 5, Calendar: &CalendarConfig{Period: "year"}}, "calendar: unknown calendar period"},
		"bad zone":            {Zone{MaxEvents: 5, Calendar: &CalendarConfig{Period: "day", TimeZone: "Mars/Olympus"}}, "calendar: unknown time zone"},
		"leaky bucket":        {Zone{Algorithm: "leaky_bucket", MaxEvents: 5, Calendar: &CalendarConfig{Period: "day"}}, "applies only to fixed_window"},
	} {
		if err := c.zone.validate("z"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: validate = %v, want an error about %q", name, err, c.want)
		}
	}
	ok := Zone{MaxEvents: 5, Calendar: &CalendarConfig{Period: "week", TimeZone: "Asia/Tokyo"}}
	if err := ok.validate("z"); err != nil {
		t.Errorf("validate: %v", err)
	}
}

// TestCalendarHeaders: a calendar zone's headers count down to the local
// window's end, and RateLimit-Policy gives the current window's length:
// 23 hours on the day Berlin springs forward, 24 the day after.
func TestCalendarHeaders(t *testing.T) {
	berlin := testutil.MustLoad(t, "Europe/Berlin")
	clock := testutil.NewClock(time.Date(2026, 3, 29, 12, 0, 0, 0, berlin)) // CEST, 12 h to midnight
	h := provisionHandlerAt(t, `rate_limit {
		zone cal_headers {
			key ip
			events 3
			calendar day Europe/Berlin
		}
		zone cal_plain {
			key ip
			algorithm fixed_window
			rate 100/1h
		}
	}`, clock)
	check := func(remaining, policyW, t1 int64, resetAt time.Time) {
		t.Helper()
		r, _ := newKeyRequest("198.51.100.7", nil)
		w, code := serve(h, r, okHandler)
		if code != 200 {
			t.Fatalf("status %d", code)
		}
		hdr := w.Header()
		if got, want := hdr.Get("RateLimit-Policy"), `"cal_headers";q=3;w=`+strconv.FormatInt(policyW, 10)+`, "cal_plain";q=100;w=3600`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		if got, want := hdr.Get("RateLimit"), `"cal_headers";r=`+strconv.FormatInt(remaining, 10)+`;t=`+strconv.FormatInt(t1, 10); !strings.HasPrefix(got, want+",") {
			t.Errorf("RateLimit %q, want it to begin %q", got, want)
		}
		if got, want := hdr.Get("X-RateLimit-Reset"), strconv.FormatInt(resetAt.Unix(), 10); got != want {
			t.Errorf("X-RateLimit-Reset %s, want %s (%s)", got, want, resetAt)
		}
	}
	midnight := time.Date(2026, 3, 30, 0, 0, 0, 0, berlin)
	check(2, 23*3600, 12*3600, midnight)
	clock.Advance(11*time.Hour + 59*time.Minute + 59*time.Second) // 23:59:59
	check(1, 23*3600, 1, midnight)
	clock.Advance(time.Second) // a new day of 24 hours
	check(2, 24*3600, 24*3600, time.Date(2026, 3, 31, 0, 0, 0, 0, berlin))
}

// BenchmarkHandlerFixedWindow is one allowed request through a fixed
// window zone of a day, keyed by client IP: the baseline of
// BenchmarkHandlerCalendarWindow.
func BenchmarkHandlerFixedWindow(b *testing.B) {
	h := provisionHandler(b, "rate_limit {\n zone bench_fw {\n  key ip\n  algorithm fixed_window\n  events 10000000\n  window 24h\n }\n}")
	r, _ := newKeyRequest("198.51.100.9", nil)
	benchServeFresh(b, h, []*http.Request{r})
}

// BenchmarkHandlerCalendarWindow is BenchmarkHandlerFixedWindow with
// calendar days in Europe/Berlin: the decision and the RateLimit-Policy
// member of the current window are remembered, so it costs about the same
// and allocates nothing more.
func BenchmarkHandlerCalendarWindow(b *testing.B) {
	h := provisionHandler(b, "rate_limit {\n zone bench_cal {\n  key ip\n  events 10000000\n  calendar day Europe/Berlin\n }\n}")
	r, _ := newKeyRequest("198.51.100.9", nil)
	benchServeFresh(b, h, []*http.Request{r})
}

// TestCalendarResponseCost: a calendar zone settles a cost by the
// response as any fixed window does; a key that owes is refused until
// its local day ends, and the next day starts at zero.
func TestCalendarResponseCost(t *testing.T) {
	tokyo := testutil.MustLoad(t, "Asia/Tokyo")
	clock := testutil.NewClock(time.Date(2026, 6, 1, 22, 0, 0, 0, tokyo))
	h := provisionHandlerAt(t, `rate_limit {
		zone cal_tokens {
			key ip
			events 100
			calendar day Asia/Tokyo
			response_cost X-Tokens
		}
	}`, clock)
	ip := "198.51.100.77"
	step := func(next caddyhttp.Handler, wantCode int, wantRemaining string) {
		t.Helper()
		r, _ := newKeyRequest(ip, nil)
		w, code := serve(h, r, next)
		if code != wantCode {
			t.Fatalf("status %d, want %d", code, wantCode)
		}
		if got := remainingIn(t, w.Header(), "cal_tokens"); got != wantRemaining {
			t.Fatalf("remaining %s, want %s", got, wantRemaining)
		}
	}
	step(answer(200, "X-Tokens", "30"), 200, "99") // the headers are written before the response
	step(answer(200, "X-Tokens", "150"), 200, "69")
	step(answer(200, "X-Tokens", "1"), 429, "0") // owes: 1+30+150 of 100
	clock.Set(time.Date(2026, 6, 2, 0, 0, 0, 0, tokyo))
	step(answer(200, "X-Tokens", "1"), 200, "99")
}

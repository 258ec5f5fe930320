package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// rateLimitFields are every field a header family writes, and Retry-After,
// canonical: a response carries exactly those its families write.
var rateLimitFields = []string{
	hdrLimit, hdrRemaining, hdrReset,
	hdrRateLimit, hdrPolicy,
	hdrDraft6Limit, hdrDraft6Remaining, hdrDraft6Reset,
	hdrRetryAfter,
}

// zoneState is what one zone's fields report: its quota and window, what
// is left, and the seconds until its quota is whole.
type zoneState struct {
	name          string
	quota, window int64
	remaining     int64
	reset         int64
}

// wantFields is the fields a response decided at now must carry with
// families set: zones in the order the handler evaluated them, reported
// the one the single-valued families describe, and retry the Retry-After
// of a refusal (0 for none), which is the refusing zone's reset in every
// family but x-ratelimit (an epoch second of when the quota is whole).
func wantFields(families headerFamilies, now time.Time, zones []zoneState, reported int, retry int64) map[string]string {
	want := map[string]string{}
	reset := func(i int) int64 {
		if retry > 0 && i == reported {
			return retry
		}
		return zones[i].reset
	}
	if retry > 0 {
		want[hdrRetryAfter] = strconv.FormatInt(retry, 10)
	}
	o := zones[reported]
	if families&familyXRateLimit != 0 {
		want[hdrLimit] = strconv.FormatInt(o.quota, 10)
		want[hdrRemaining] = strconv.FormatInt(o.remaining, 10)
		want[hdrReset] = strconv.FormatInt(now.Unix()+o.reset, 10)
	}
	policy := fmt.Sprintf("%d;w=%d", o.quota, o.window)
	if families&familyDraft7 != 0 {
		want[hdrRateLimit] = fmt.Sprintf("limit=%d, remaining=%d, reset=%d", o.quota, o.remaining, reset(reported))
		want[hdrPolicy] = policy
	}
	if families&familyDraft6 != 0 {
		want[hdrDraft6Limit] = strconv.FormatInt(o.quota, 10)
		want[hdrDraft6Remaining] = strconv.FormatInt(o.remaining, 10)
		want[hdrDraft6Reset] = strconv.FormatInt(reset(reported), 10)
		want[hdrPolicy] = policy
	}
	if families&familyIETF != 0 {
		var rl, pol []string
		for i, z := range zones {
			rl = append(rl, fmt.Sprintf("%q;r=%d;t=%d", z.name, z.remaining, reset(i)))
			pol = append(pol, fmt.Sprintf("%q;q=%d;w=%d", z.name, z.quota, z.window))
		}
		want[hdrRateLimit] = strings.Join(rl, ", ")
		want[hdrPolicy] = strings.Join(pol, ", ")
	}
	return want
}

// checkFields fails unless hdr carries exactly the rate-limit fields of
// want, each once, with those values.
func checkFields(t *testing.T, what string, hdr http.Header, want map[string]string) {
	t.Helper()
	for _, f := range rateLimitFields {
		got, ok := hdr[f]
		w, wanted := want[f]
		switch {
		case !wanted && ok:
			t.Errorf("%s: %s: %q, want none", what, f, got)
		case wanted && (len(got) != 1 || got[0] != w):
			t.Errorf("%s: %s: %q, want %q", what, f, got, w)
		}
	}
}

// TestHandlerHeaderFamilies: each family, and each combination allowed,
// writes exactly its fields, on admitted and refused responses, for two
// zones: the lists (ietf) name every zone that decided, the single-valued
// families (draft-7, draft-6, x-ratelimit) the refusing zone or else the
// one with the least remaining, and the drafts' reset is Retry-After on a
// refusal. A token bucket, whose refusal's wait (one token) is shorter
// than its time to fill up, and a fixed window, on a set clock, make every
// value exact and tell the two apart.
func TestHandlerHeaderFamilies(t *testing.T) {
	start := time.Date(2026, 1, 5, 10, 0, 20, 0, time.UTC)
	for i, tc := range []struct {
		headers  string // "" leaves the option out
		families headerFamilies
	}{
		{"", familyXRateLimit | familyIETF},
		{"both", familyXRateLimit | familyIETF},
		{"x-ratelimit ietf", familyXRateLimit | familyIETF},
		{"x-ratelimit", familyXRateLimit},
		{"ietf", familyIETF},
		{"draft-7", familyDraft7},
		{"draft-6", familyDraft6},
		{"x-ratelimit draft-7", familyXRateLimit | familyDraft7},
		{"draft-6 x-ratelimit", familyXRateLimit | familyDraft6},
		{"none", 0},
	} {
		t.Run(strings.ReplaceAll(tc.headers, " ", "+"), func(t *testing.T) {
			clock := testutil.NewClock(start)
			// Zones of their own per case: same-named zones share a store.
			bucket, hourly := fmt.Sprintf("fam%d_bucket", i), fmt.Sprintf("fam%d_hourly", i)
			blocks := []string{
				// A token every 30s, two at most: q=2;w=60.
				zoneConfig(bucket, "key ip", "algorithm token_bucket", "rate 2/1m"),
				zoneConfig(hourly, "key ip", "algorithm fixed_window", "events 3", "window 1h"),
			}
			if tc.headers != "" {
				blocks = append(blocks, "headers "+tc.headers)
			}
			h := provisionHandlerAt(t, rateLimitConfig(blocks...), clock)
			if h.headers != tc.families {
				t.Fatalf("headers %q: families %b, want %b", tc.headers, h.headers, tc.families)
			}
			// evaluated is how many zones, in order, decided the request:
			// a zone after the one that refuses is not asked.
			step := func(what string, code int, bucketLeft, bucketReset, hourlyLeft, hourlyReset int64, evaluated, reported int, retry int64) {
				t.Helper()
				r, _ := newKeyRequest("198.51.100.40", nil)
				w, got := serve(h, r, okHandler)
				if got != code {
					t.Fatalf("%s: status %d, want %d", what, got, code)
				}
				zones := []zoneState{
					{bucket, 2, 60, bucketLeft, bucketReset},
					{hourly, 3, 3600, hourlyLeft, hourlyReset},
				}
				checkFields(t, what, w.Header(), wantFields(tc.families, clock.Now(), zones[:evaluated], reported, retry))
			}
			// The bucket has the least left, so it is reported.
			step("first", 200, 1, 30, 2, 3580, 2, 0, 0)
			step("second", 200, 0, 60, 1, 3580, 2, 0, 0)
			// The bucket refuses: a token comes in 30s, the bucket is
			// full in 60s; the hourly zone is not asked.
			step("refused by the bucket", 429, 0, 60, 1, 3580, 1, 0, 30)
			// The bucket fills up again: the hourly zone has the least left.
			clock.Advance(time.Minute)
			step("fourth", 200, 1, 30, 0, 3520, 2, 1, 0)
			// The hourly zone refuses; the bucket gives back its take.
			step("refused by the hourly zone", 429, 1, 30, 0, 3520, 2, 1, 3520)
		})
	}
}

// TestHandlerDraftPolicy: the RateLimit-Policy of drafts 6 and 7 gives a
// bucket's capacity and refill time, as ietf's does (rate 100/1m burst 20
// is 20;w=12), and a calendar zone's current window: 23 hours on the day
// Berlin springs forward, 24 the day after.
func TestHandlerDraftPolicy(t *testing.T) {
	for _, family := range []string{"draft-7", "draft-6"} {
		t.Run(family, func(t *testing.T) {
			suffix := strings.ReplaceAll(family, "-", "")
			h := provisionHandler(t, rateLimitConfig(
				zoneConfig("policy_bucket_"+suffix, "key ip", "algorithm token_bucket", "rate 100/1m", "burst 20"),
				"headers "+family,
			))
			r, _ := newKeyRequest("198.51.100.41", nil)
			w, _ := serve(h, r, okHandler)
			if got := w.Header().Get("RateLimit-Policy"); got != "20;w=12" {
				t.Errorf("token bucket: RateLimit-Policy %q, want 20;w=12", got)
			}

			berlin := testutil.MustLoad(t, "Europe/Berlin")
			clock := testutil.NewClock(time.Date(2026, 3, 29, 12, 0, 0, 0, berlin)) // 12 h to midnight
			h = provisionHandlerAt(t, rateLimitConfig(
				zoneConfig("policy_cal_"+suffix, "key ip", "events 3", "calendar day Europe/Berlin"),
				"headers "+family,
			), clock)
			check := func(what, policy, reset string) {
				t.Helper()
				r, _ := newKeyRequest("198.51.100.42", nil)
				w, _ := serve(h, r, okHandler)
				hdr := w.Header()
				if got := hdr.Get("RateLimit-Policy"); got != policy {
					t.Errorf("%s: RateLimit-Policy %q, want %q", what, got, policy)
				}
				gotReset := hdr.Get("RateLimit-Reset")
				if family == "draft-7" {
					_, gotReset, _ = strings.Cut(hdr.Get("RateLimit"), "reset=")
				}
				if gotReset != reset {
					t.Errorf("%s: reset %q, want %q", what, gotReset, reset)
				}
			}
			check("the day clocks spring forward", "3;w=82800", "43200")
			clock.Advance(12 * time.Hour) // the next day, 24 hours long
			check("the day after", "3;w=86400", "86400")
		})
	}
}

// TestHandlerHeaderFamiliesAllocate: every family costs an admitted
// request the allocations today's default does, since all write into
// one buffer.
func TestHandlerHeaderFamiliesAllocate(t *testing.T) {
	allocs := map[string]float64{}
	for _, families := range []string{"x-ratelimit ietf", "ietf", "draft-7", "draft-6", "x-ratelimit draft-7", "x-ratelimit draft-6"} {
		name := "allocs_" + strings.NewReplacer(" ", "_", "-", "_").Replace(families)
		h := provisionHandler(t, rateLimitConfig(
			zoneConfig(name, "key ip", "algorithm token_bucket", "rate 1000000000/1s"),
			"headers "+families,
		))
		reqs := make([]*http.Request, 101) // AllocsPerRun runs once more than asked, to warm up
		for i := range reqs {
			reqs[i], _ = newKeyRequest("198.51.100.43", nil)
		}
		w := httptest.NewRecorder()
		i := 0
		allocs[families] = testing.AllocsPerRun(100, func() {
			clear(w.Header())
			if err := h.ServeHTTP(w, reqs[i], okHandler); err != nil {
				t.Fatal(err)
			}
			i++
		})
	}
	for families, n := range allocs {
		if n != allocs["x-ratelimit ietf"] {
			t.Errorf("headers %s: %.0f allocations per request, want %.0f as the default", families, n, allocs["x-ratelimit ietf"])
		}
	}
}

// BenchmarkHandlerHeaders is BenchmarkHandlerIPKey with each family of
// fields alone, and today's default: what writing each costs.
func BenchmarkHandlerHeaders(b *testing.B) {
	for _, families := range []string{"ietf", "draft-7", "draft-6", "x-ratelimit ietf"} {
		b.Run(strings.ReplaceAll(families, " ", "+"), func(b *testing.B) {
			name := "bench_headers_" + strings.NewReplacer(" ", "_", "-", "_").Replace(families)
			h := provisionHandler(b, rateLimitConfig(
				zoneConfig(name, "key ip", "algorithm token_bucket", "rate 1000000000/1s"),
				"headers "+families,
			))
			r, _ := newKeyRequest("198.51.100.9", nil)
			benchServeFresh(b, h, []*http.Request{r})
		})
	}
}

// TestCaddyfileHeaders: `headers` takes one family or several, kept as
// written; the families a handler writes follow from them.
func TestCaddyfileHeaders(t *testing.T) {
	for in, want := range map[string]headerFamilies{
		"both":                       familyXRateLimit | familyIETF,
		"none":                       0,
		"x-ratelimit":                familyXRateLimit,
		"ietf":                       familyIETF,
		"draft-7":                    familyDraft7,
		"draft-6":                    familyDraft6,
		"ietf x-ratelimit":           familyXRateLimit | familyIETF,
		"x-ratelimit draft-7":        familyXRateLimit | familyDraft7,
		"draft-6 x-ratelimit":        familyXRateLimit | familyDraft6,
		"x-ratelimit\\\n    draft-6": familyXRateLimit | familyDraft6,
	} {
		h, err := parseDirective(t, "rate_limit {\n zone a {\n  rate 5/s\n }\n headers "+in+"\n}")
		if err != nil {
			t.Errorf("headers %s: %v", in, err)
			continue
		}
		if got, err := parseHeaderFamilies(h.Headers); err != nil || got != want {
			t.Errorf("headers %s: parsed as %q, families %b (%v), want %b", in, h.Headers, got, err, want)
		}
	}
	// Left out, the JSON has no headers and the handler the default.
	h, err := parseDirective(t, "rate_limit {\n zone a {\n  rate 5/s\n }\n}")
	if err != nil || h.Headers != nil {
		t.Fatalf("no headers option: %q, %v", h.Headers, err)
	}
}

// TestCaddyfileHeadersRefused: families that write the same field, none
// or both with anything, a family twice or unknown, and no family, are
// refused at the option's line, naming the families and the field.
func TestCaddyfileHeadersRefused(t *testing.T) {
	cfg := func(headers string) string {
		return "rate_limit {\n zone a {\n  rate 5/s\n }\n\n headers " + headers + "\n log_key\n}"
	}
	runParseErrorCases(t, []parseErrorCase{
		{"ietf and draft-7", cfg("ietf draft-7"), []string{"headers", "ietf and draft-7 cannot be combined", "both write RateLimit and RateLimit-Policy", ":6"}},
		{"draft-7 and ietf", cfg("x-ratelimit draft-7 ietf"), []string{"draft-7 and ietf cannot be combined", "RateLimit and RateLimit-Policy", ":6"}},
		{"ietf and draft-6", cfg("ietf draft-6"), []string{"ietf and draft-6 cannot be combined", "both write RateLimit-Policy;", ":6"}},
		{"draft-6 and draft-7", cfg("draft-6 draft-7"), []string{"draft-6 and draft-7 cannot be combined", "both write RateLimit-Policy;", ":6"}},
		{"none and more", cfg("none x-ratelimit"), []string{"none cannot be combined", ":6"}},
		{"more and none", cfg("draft-7 none"), []string{"none cannot be combined", ":6"}},
		{"both and more", cfg("both draft-6"), []string{"both cannot be combined", "x-ratelimit and ietf", ":6"}},
		{"twice", cfg("draft-6 x-ratelimit draft-6"), []string{"draft-6 is listed twice", ":6"}},
		{"unknown", cfg("draft-8"), []string{`unknown header family "draft-8"`, "draft-7", ":6"}},
		{"no family", cfg(""), []string{"option 'headers' takes <family>", ":6"}},
		{"headers twice", "rate_limit {\n zone a {\n  rate 5/s\n }\n headers ietf\n headers draft-7\n}", []string{"option 'headers' specified twice", ":6"}},
	})
}

// TestJSONHeaders: the JSON field takes a list of families, or one name as
// a string as configs written before lists were (null and "" are the
// default); Provision refuses what the Caddyfile refuses, naming the
// families and the field.
func TestJSONHeaders(t *testing.T) {
	provision := func(headers string) (*Handler, error) {
		var h Handler
		raw := `{"rate_limits":{"json_headers":{"max_events":5,"window":"1m"}},"headers":` + headers + `}`
		if err := json.Unmarshal([]byte(raw), &h); err != nil {
			return nil, err
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		err := h.Provision(ctx)
		t.Cleanup(func() { _ = h.Cleanup() })
		return &h, err
	}
	for in, want := range map[string]headerFamilies{
		`null`:                       familyXRateLimit | familyIETF,
		`""`:                         familyXRateLimit | familyIETF,
		`"both"`:                     familyXRateLimit | familyIETF,
		`"none"`:                     0,
		`"x-ratelimit"`:              familyXRateLimit,
		`"ietf"`:                     familyIETF,
		`"draft-7"`:                  familyDraft7,
		`[]`:                         familyXRateLimit | familyIETF,
		`["draft-6"]`:                familyDraft6,
		`["x-ratelimit","draft-7"]`:  familyXRateLimit | familyDraft7,
		`["none"]`:                   0,
		`["draft-6", "x-ratelimit"]`: familyXRateLimit | familyDraft6,
	} {
		h, err := provision(in)
		if err != nil {
			t.Errorf("headers %s: %v", in, err)
			continue
		}
		if h.headers != want {
			t.Errorf("headers %s: families %b, want %b", in, h.headers, want)
		}
	}
	for in, want := range map[string]string{
		`["ietf","draft-7"]`:    "headers: ietf and draft-7 cannot be combined: both write RateLimit and RateLimit-Policy",
		`["draft-7","draft-6"]`: "headers: draft-7 and draft-6 cannot be combined: both write RateLimit-Policy",
		`["none","ietf"]`:       "headers: none cannot be combined",
		`"x-ratelimit ietf"`:    `headers: unknown header family "x-ratelimit ietf"`,
		`"some"`:                `headers: unknown header family "some"`,
		`5`:                     "headers: want a header family name or a list of them",
		`["ietf",5]`:            "headers: want a header family name or a list of them",
	} {
		_, err := provision(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("headers %s: error %v, want one containing %q", in, err, want)
		}
	}
	// The Caddyfile's list is adapted to a JSON list, which loads back.
	h, err := parseDirective(t, "rate_limit {\n zone a {\n  rate 5/s\n }\n headers x-ratelimit draft-6\n}")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(h)
	if err != nil || !strings.Contains(string(raw), `"headers":["x-ratelimit","draft-6"]`) {
		t.Fatalf("adapted %s (%v), want headers as a list", raw, err)
	}
}

package ratelimit

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func TestCaddyfileZoneOptions(t *testing.T) {
	h, err := parseDirective(t, `rate_limit {
		zone api {
			match {
				path /api/*
			}
			key header X-API-Key
			algorithm token_bucket
			rate 100/1m
			burst 20
			cost 2
			missing_key deny
			ipv4_prefix 24
			ipv6_prefix 56
			dry_run
		}
		zone writes {
			algorithm leaky_bucket
			events 5
			window 1s
			max_delay 0s
		}
		headers ietf
		log_key
		sweep_interval 30s
		max_keys 1000
		jitter 0.25
		disable_metrics
	}`)
	if err != nil {
		t.Fatal(err)
	}
	api := h.RateLimits["api"]
	if api == nil {
		t.Fatal("zone api missing")
	}
	if api.Key != "{http.request.header.X-API-Key}" || api.Algorithm != "token_bucket" ||
		api.MaxEvents != 100 || time.Duration(api.Window) != time.Minute || api.Burst != 20 ||
		api.Cost != "2" || api.MissingKey != "deny" || api.IPv4Prefix != 24 || api.IPv6Prefix != 56 ||
		!api.DryRun || len(api.MatcherSetsRaw) != 1 {
		t.Fatalf("zone api parsed as %+v", api)
	}
	w := h.RateLimits["writes"]
	if w.MaxDelay == nil || *w.MaxDelay != 0 || w.MaxEvents != 5 || time.Duration(w.Window) != time.Second {
		t.Fatalf("zone writes parsed as %+v", w)
	}
	if !slices.Equal(h.Headers, HeaderFamilies{"ietf"}) || !h.LogKey || time.Duration(h.SweepInterval) != 30*time.Second ||
		h.MaxKeys != 1000 || h.Jitter != 0.25 || !h.DisableMetrics {
		t.Fatalf("handler parsed as %+v", h)
	}
}

func TestCaddyfileRateShorthand(t *testing.T) {
	for in, want := range map[string]struct {
		events int64
		window time.Duration
	}{
		"100/1m":   {100, time.Minute},
		"10/30s":   {10, 30 * time.Second},
		"5/s":      {5, time.Second},
		"1000/h":   {1000, time.Hour},
		"10000/d":  {10000, 24 * time.Hour},
		"3/1m30s":  {3, 90 * time.Second},
		"250/10ms": {250, 10 * time.Millisecond},
	} {
		h, err := parseDirective(t, "rate_limit {\nzone z {\nrate "+in+"\n}\n}")
		if err != nil {
			t.Errorf("rate %s: %v", in, err)
			continue
		}
		z := h.RateLimits["z"]
		if z.MaxEvents != want.events || time.Duration(z.Window) != want.window {
			t.Errorf("rate %s: got %d/%v", in, z.MaxEvents, time.Duration(z.Window))
		}
	}
}

func TestCaddyfileKeys(t *testing.T) {
	for in, want := range map[string]string{
		"ip":                           "{http.vars.client_ip}",
		"header Authorization":         "{http.request.header.Authorization}",
		"{http.vars.client_ip}:{path}": "{http.vars.client_ip}:{path}",
		"global":                       "global",
	} {
		h, err := parseDirective(t, "rate_limit {\nzone z {\nkey "+in+"\nrate 1/s\n}\n}")
		if err != nil {
			t.Errorf("key %s: %v", in, err)
			continue
		}
		if got := h.RateLimits["z"].Key; got != want {
			t.Errorf("key %s: got %q, want %q", in, got, want)
		}
	}
}

// TestCaddyfileNumberErrorsNameTheOption: a number an option cannot take
// is refused with the option's name, not only the value, and an int option
// is bounded rather than wrapped.
func TestCaddyfileNumberErrorsNameTheOption(t *testing.T) {
	runParseErrorCases(t, []parseErrorCase{
		{"zero burst", "rate_limit {\n zone a {\n  rate 1/s\n  burst 0\n }\n}", []string{"zone a: option 'burst': want a positive integer", ":4"}},
		{"zero max_keys", "rate_limit {\n zone a {\n  rate 1/s\n }\n max_keys 0\n}", []string{"rate_limit: option 'max_keys': must be from 1 to", ":5"}},
		{"huge max_keys", "rate_limit {\n zone a {\n  rate 1/s\n }\n max_keys 9999999999\n}", []string{"rate_limit: option 'max_keys': must be from 1 to", ":5"}},
	})
}

// TestCaddyfileErrorsNameZoneAndLine checks every refusal docs/reference.md
// lists for a Caddyfile: each names the zone (where there is one) and the line.
func TestCaddyfileErrorsNameZoneAndLine(t *testing.T) {
	runParseErrorCases(t, []parseErrorCase{
		{"unknown zone option", "rate_limit {\n zone a {\n  rate 1/s\n  bogus 1\n }\n}", []string{"zone a: ", "bogus", ":4"}},
		{"repeated option", "rate_limit {\n zone a {\n  events 1\n  events 2\n  window 1s\n }\n}", []string{"zone a: ", "twice", ":4"}},
		{"unknown handler option", "rate_limit {\n zone a {\n  rate 1/s\n }\n nope\n}", []string{"nope", ":5"}},
		{"repeated handler option", "rate_limit {\n zone a {\n  rate 1/s\n }\n jitter 1\n jitter 2\n}", []string{"jitter", "twice", ":6"}},
		{"missing window", "rate_limit {\n zone a {\n  events 5\n }\n}", []string{"zone a: ", "window", ":2"}},
		{"missing events", "rate_limit {\n zone a {\n  window 1m\n }\n}", []string{"zone a: ", "events", ":2"}},
		{"zero events", "rate_limit {\n zone a {\n  events 0\n  window 1m\n }\n}", []string{"zone a: ", "positive", ":3"}},
		{"negative events", "rate_limit {\n zone a {\n  events -1\n  window 1m\n }\n}", []string{"zone a: ", "positive", ":3"}},
		{"zero window", "rate_limit {\n zone a {\n  events 1\n  window 0s\n }\n}", []string{"zone a: ", "positive", ":4"}},
		{"negative window", "rate_limit {\n zone a {\n  events 1\n  window -5s\n }\n}", []string{"zone a: ", ":4"}},
		{"rate then events", "rate_limit {\n zone a {\n  rate 5/s\n  events 5\n }\n}", []string{"zone a: ", "rate", ":4"}},
		{"window then rate", "rate_limit {\n zone a {\n  window 1s\n  rate 5/s\n }\n}", []string{"zone a: ", "rate", ":4"}},
		{"bad rate", "rate_limit {\n zone a {\n  rate 5\n }\n}", []string{"zone a: ", "rate", ":3"}},
		{"zero rate", "rate_limit {\n zone a {\n  rate 0/s\n }\n}", []string{"zone a: ", ":3"}},
		{"cost above events", "rate_limit {\n zone a {\n  rate 5/s\n  cost 6\n }\n}", []string{"zone a: ", "cost", ":2"}},
		{"cost above burst", "rate_limit {\n zone a {\n  algorithm token_bucket\n  rate 50/s\n  burst 3\n  cost 4\n }\n}", []string{"zone a: ", "cost", ":2"}},
		{"unknown algorithm", "rate_limit {\n zone a {\n  algorithm gcra\n  rate 5/s\n }\n}", []string{"zone a: ", "gcra", ":2"}},
		{"burst on window", "rate_limit {\n zone a {\n  rate 5/s\n  burst 3\n }\n}", []string{"zone a: ", "burst", ":2"}},
		{"max_delay on token bucket", "rate_limit {\n zone a {\n  algorithm token_bucket\n  rate 5/s\n  max_delay 1s\n }\n}", []string{"zone a: ", "max_delay", ":2"}},
		{"bad missing_key", "rate_limit {\n zone a {\n  rate 5/s\n  missing_key maybe\n }\n}", []string{"zone a: ", "missing_key", ":2"}},
		{"bad store", "rate_limit {\n zone a {\n  rate 5/s\n  store disk\n }\n}", []string{"zone a: ", "store", ":2"}},
		{"bad prefix", "rate_limit {\n zone a {\n  rate 5/s\n  ipv6_prefix 200\n }\n}", []string{"zone a: ", "ipv6_prefix", ":4"}},
		{"bad headers", "rate_limit {\n zone a {\n  rate 5/s\n }\n headers some\n}", []string{"headers", ":5"}},
		{"bad key", "rate_limit {\n zone a {\n  key {oops\n  rate 5/s\n }\n}", []string{"zone a: ", "placeholder", ":3"}},
		{"zone twice", "rate_limit {\n zone a {\n  rate 5/s\n }\n zone a {\n  rate 5/s\n }\n}", []string{"rate_limit: zone 'a' specified twice", ":5"}},
		{"no zone", "rate_limit {\n headers none\n}", []string{"zone"}},
		{"zone name not ASCII", "rate_limit {\n zone zoné {\n  rate 5/s\n }\n}", []string{"ASCII", ":2"}},
		{"negative jitter", "rate_limit {\n zone a {\n  rate 5/s\n }\n jitter -1\n}", []string{"jitter", ":5"}},
	})
}

// TestCaddyfileNearCacheErrors: local_quota and deny_cache are refused,
// with the zone and the line, where they cannot apply.
func TestCaddyfileNearCacheErrors(t *testing.T) {
	redis := "\n redis {\n  addresses 127.0.0.1:6379\n }\n}"
	runParseErrorCases(t, []parseErrorCase{
		{"local_quota on memory", "rate_limit {\n zone a {\n  rate 5/s\n  local_quota 0.1\n }\n}", []string{"zone a: ", "local_quota", "store redis", ":2"}},
		{"local_quota on leaky bucket", "rate_limit {\n zone a {\n  algorithm leaky_bucket\n  rate 5/s\n  store redis\n  local_quota 0.1\n }" + redis, []string{"zone a: ", "local_quota", "leaky_bucket", ":2"}},
		{"local_quota on concurrency", "rate_limit {\n zone a {\n  algorithm concurrency\n  events 5\n  store redis\n  local_quota 0.1\n }" + redis, []string{"zone a: ", "local_quota", "concurrency", ":2"}},
		{"local_quota zero", "rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  local_quota 0\n }" + redis, []string{"zone a: ", "local_quota", ":5"}},
		{"local_quota above one", "rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  local_quota 1.5\n }" + redis, []string{"zone a: ", "local_quota", ":5"}},
		{"local_quota not a number", "rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  local_quota lots\n }" + redis, []string{"zone a: ", "local_quota", ":5"}},
		{"deny_cache on memory", "rate_limit {\n zone a {\n  rate 5/s\n  deny_cache 1s\n }\n}", []string{"zone a: ", "deny_cache", ":2"}},
		{"deny_cache on concurrency", "rate_limit {\n zone a {\n  algorithm concurrency\n  events 5\n  store redis\n  deny_cache 1s\n }" + redis, []string{"zone a: ", "deny_cache", "concurrency", ":2"}},
		{"deny_cache bad", "rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  deny_cache soon\n }" + redis, []string{"zone a: ", "deny_cache", ":5"}},
	})
	for _, ok := range []string{
		"rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  local_quota 1\n  deny_cache off\n }" + redis,
		"rate_limit {\n zone a {\n  algorithm concurrency\n  events 5\n  store redis\n  deny_cache off\n }" + redis,
		"rate_limit {\n zone a {\n  algorithm token_bucket\n  rate 5/s\n  store redis\n  local_quota 0.25\n  deny_cache 500ms\n }" + redis,
	} {
		if _, err := parseDirective(t, ok); err != nil {
			t.Errorf("refused %q: %v", ok, err)
		}
	}
}

// TestCaddyfileAdaptLoads adapts a whole Caddyfile the way `caddy adapt`
// does and checks the handler JSON round-trips into a valid Handler.
func TestCaddyfileAdaptLoads(t *testing.T) {
	input := `:8080 {
		rate_limit @api {
			zone per_ip {
				key ip
				algorithm token_bucket
				rate 10/s
			}
			distributed {
				read_interval 5s
			}
		}
		@api path /api/*
		respond "ok"
	}`
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, warnings, err := adapter.Adapt([]byte(input), nil)
	if err != nil {
		t.Fatalf("adapt: %v (warnings %v)", err, warnings)
	}
	var found bool
	for _, rt := range adaptedRoutes(t, out) {
		for _, raw := range rt.Handle {
			var probe struct{ Handler string }
			_ = json.Unmarshal(raw, &probe)
			if probe.Handler != "rate_limit" {
				continue
			}
			found = true
			if len(rt.Match) == 0 {
				t.Error("the @api matcher token was not applied to the route")
			}
			var h Handler
			if err := json.Unmarshal(raw, &h); err != nil {
				t.Fatal(err)
			}
			if err := h.validate(); err != nil {
				t.Fatalf("adapted handler does not validate: %v", err)
			}
			if len(h.Distributed) == 0 {
				t.Error("distributed block lost in adaptation")
			}
		}
	}
	if !found {
		t.Fatalf("no rate_limit handler in %s", out)
	}
}

// TestDirectiveOrdered checks users need no `order` line: adapting a site
// with rate_limit after respond still puts rate_limit first.
func TestDirectiveOrdered(t *testing.T) {
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, _, err := adapter.Adapt([]byte(":8080 {\n respond ok\n rate_limit {\n  zone z {\n   rate 1/s\n  }\n }\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if i, j := strings.Index(s, `"rate_limit"`), strings.Index(s, `"static_response"`); i < 0 || j < 0 || i > j {
		t.Fatalf("rate_limit not ordered before respond: %s", s)
	}
}

// TestMholtJSONLoads checks a JSON config written for mholt/caddy-ratelimit
// validates unchanged.
func TestMholtJSONLoads(t *testing.T) {
	raw := `{"handler":"rate_limit","rate_limits":{"static":{"match":[{"method":["GET"]}],"key":"static","window":"1m","max_events":100},
		"dynamic":{"key":"{http.request.remote.host}","window":5000000000,"max_events":2}},
		"distributed":{"write_interval":"5s","read_interval":"5s"},"storage":{"module":"file_system","root":"/tmp"},
		"jitter":0.2,"sweep_interval":"1m","log_key":true}`
	var h Handler
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	if err := h.validate(); err != nil {
		t.Fatal(err)
	}
	if z := h.RateLimits["static"]; time.Duration(z.Window) != time.Minute || z.MaxEvents != 100 || z.policy().Algorithm != "sliding_window_log" {
		t.Fatalf("static zone: %+v", z)
	}
}

func FuzzCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"rate_limit {\n zone a {\n  rate 5/s\n }\n}",
		"rate_limit {\n zone a {\n  key header X\n  algorithm leaky_bucket\n  rate 2/s\n  max_delay 1s\n }\n headers ietf\n jitter 0.1\n}",
		"rate_limit {\n zone a {\n  match {\n   path /x\n  }\n  events 3\n  window 1m\n  tier {plan} {\n   pro 10/s\n  }\n }\n distributed {\n  read_interval 1s\n }\n}",
		"rate_limit {\n zone {\n }\n}",
		"rate_limit x y {",
		"rate_limit {\n zone a {\n  rate 9223372036854775807/1ns\n  cost 9223372036854775807\n }\n}",
		"rate_limit {\n zone a {\n  key {a}{b}\\{c\\}\n  rate 1/d\n }\n}",
		"rate_limit {\n zone a {\n  rate 5/s\n  store redis\n  local_quota 0.2\n }\n redis {\n  url redis://u:p@127.0.0.1:6379/0\n  timeout 50ms\n  tls {\n   server_name x\n  }\n }\n key_secret {env.K}\n}",
		"rate_limit {\n zone a {\n  key jwt_claim sub\n  rate 5/s\n }\n jwt {\n  secret {env.S}\n  from header Authorization\n  leeway 5s\n }\n}",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		d, ok := fuzzDispenser(input)
		if !ok {
			return
		}
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(d); err != nil {
			return
		}
		// Whatever parses must validate or be refused cleanly, and its
		// policies must compile.
		if err := h.validate(); err != nil {
			return
		}
		for _, z := range h.RateLimits {
			if err := z.policy().Validate(); err != nil {
				t.Fatalf("validated zone has an invalid policy: %v", err)
			}
		}
	})
}

package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// jsonHandler is a handler's JSON with one memory zone, a redis zone and
// a redis block, with extra fields spliced in at the handler, the memory
// zone, the redis zone and the redis block.
func jsonHandler(handler, zone, redisZone, redis string) string {
	join := func(s string) string {
		if s == "" {
			return ""
		}
		return "," + s
	}
	return `{"rate_limits":{` +
		`"mem":{"max_events":5,"window":"1m"` + join(zone) + `},` +
		`"red":{"max_events":5,"window":"1m","store":"redis"` + join(redisZone) + `}},` +
		`"redis":{"url":"redis://127.0.0.1:6379"` + join(redis) + `}` + join(handler) + `}`
}

// TestJSONRefusesBadNumbers: a JSON config is refused, naming the field,
// for every number the Caddyfile refuses: a jitter, fraction or duration
// out of range or below its floor. (JSON cannot spell NaN or infinity;
// TestValidateRefusesNonFinite covers them.)
func TestJSONRefusesBadNumbers(t *testing.T) {
	for _, tc := range []struct {
		name, config, field string
	}{
		{"huge jitter", jsonHandler(`"jitter":1e300`, "", "", ""), "jitter"},
		{"jitter above 10", jsonHandler(`"jitter":10.5`, "", "", ""), "jitter"},
		{"negative jitter", jsonHandler(`"jitter":-0.1`, "", "", ""), "jitter"},
		{"log_sample above 1", jsonHandler(`"log_sample":1.5`, "", "", ""), "log_sample"},
		{"huge log_sample", jsonHandler(`"log_sample":1e300`, "", "", ""), "log_sample"},
		{"huge local_quota", jsonHandler("", "", `"local_quota":1e300`, ""), "local_quota"},
		{"negative local_quota", jsonHandler("", "", `"local_quota":-0.5`, ""), "local_quota"},
		{"sweep_interval under 1s", jsonHandler(`"sweep_interval":"500ms"`, "", "", ""), "sweep_interval"},
		{"sweep_interval in ns", jsonHandler(`"sweep_interval":60`, "", "", ""), "sweep_interval"},
		{"negative sweep_interval", jsonHandler(`"sweep_interval":"-1m"`, "", "", ""), "sweep_interval"},
		{"huge max_keys", jsonHandler(`"max_keys":1000000000000`, "", "", ""), "max_keys"},
		{"window under 1ms", jsonHandler("", `"window":"500us"`, "", ""), "window"},
		{"tier window under 1ms", jsonHandler("", `"tier":{"placeholder":"{plan}","limits":{"gold":{"max_events":5,"window":"100us"}}}`, "", ""), "window"},
		{"negative max_delay", jsonHandler("", `"algorithm":"leaky_bucket","max_delay":"-1s"`, "", ""), "max_delay"},
		{"deny_cache under 1ms", jsonHandler("", "", `"deny_cache":"500us"`, ""), "deny_cache"},
		{"negative deny_cache", jsonHandler("", "", `"deny_cache":"-1s"`, ""), "deny_cache"},
		{"timeout under 1ms", jsonHandler("", "", "", `"timeout":"100us"`), "timeout"},
		{"timeout in ns", jsonHandler("", "", "", `"timeout":5`), "timeout"},
		{"dial_timeout under 1ms", jsonHandler("", "", "", `"dial_timeout":"10us"`), "dial_timeout"},
		{"breaker_after under 1ms", jsonHandler("", "", "", `"breaker_after":"1us"`), "breaker_after"},
		{"breaker_open_for under 1ms", jsonHandler("", "", "", `"breaker_open_for":100`), "breaker_open_for"},
		{"negative timeout", jsonHandler("", "", "", `"timeout":"-5ms"`), "timeout"},
		{"huge pool_size", jsonHandler("", "", "", `"pool_size":1000000000000`), "pool_size"},
		{"huge db", jsonHandler("", "", "", `"db":100000`), "db"},
		{"jwt leeway negative", strings.TrimSuffix(jsonHandler("", "", "", ""), "}") + `,"jwt":{"secret":"s","leeway":"-1s"}}`, "leeway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			if err := json.Unmarshal([]byte(tc.config), &h); err != nil {
				t.Fatalf("unmarshal %s: %v", tc.config, err)
			}
			err := h.validate()
			if err == nil {
				t.Fatalf("accepted: %s", tc.config)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %s", err, tc.field)
			}
		})
	}
	// The bounds themselves are accepted.
	for _, config := range []string{
		jsonHandler(`"jitter":10,"log_sample":1,"sweep_interval":"1s"`, `"window":"1ms"`, `"local_quota":1,"deny_cache":"1ms"`,
			`"timeout":"1ms","dial_timeout":"1ms","breaker_after":"1ms","breaker_open_for":"1ms"`),
		jsonHandler(`"jitter":0,"log_sample":0`, `"algorithm":"leaky_bucket","max_delay":0`, `"deny_cache":0`, ""),
	} {
		var h Handler
		if err := json.Unmarshal([]byte(config), &h); err != nil {
			t.Fatal(err)
		}
		if err := h.validate(); err != nil {
			t.Errorf("refused %s: %v", config, err)
		}
	}
}

// TestValidateRefusesNonFinite: NaN and infinities, which JSON cannot
// spell but a Go caller or an adapter can produce, are refused by Validate
// for every fraction, naming it.
func TestValidateRefusesNonFinite(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for field, set := range map[string]func(h *Handler){
			"jitter":      func(h *Handler) { h.Jitter = v },
			"log_sample":  func(h *Handler) { h.LogSample = v },
			"local_quota": func(h *Handler) { h.RateLimits["red"].LocalQuota = v },
		} {
			t.Run(fmt.Sprintf("%s %v", field, v), func(t *testing.T) {
				var h Handler
				if err := json.Unmarshal([]byte(jsonHandler("", "", "", "")), &h); err != nil {
					t.Fatal(err)
				}
				set(&h)
				err := h.validate()
				if err == nil {
					t.Fatalf("%s %v accepted", field, v)
				}
				if !strings.Contains(err.Error(), field) {
					t.Errorf("error %q does not name %s", err, field)
				}
			})
		}
	}
}

// TestCaddyfileRefusesBadNumbers: adapting a Caddyfile refuses the same
// numbers, NaN and infinities included, naming the option and its line.
func TestCaddyfileRefusesBadNumbers(t *testing.T) {
	// Each option of a case replaces the line that holds its name's
	// default: window at line 7, the zone's other option at 6, the
	// handler's at 9, the redis block's at 11.
	const site = `:8080 {
	rate_limit {
		zone red {
			events 5
			store redis
			cost 1
			window 1m
		}
		log_key
		redis {
			key_prefix x:
			url redis://127.0.0.1:6379
		}
	}
	respond "ok"
}`
	for _, tc := range []struct {
		name, option, field string
		line                int
	}{
		{"jitter inf", "jitter inf", "jitter", 9},
		{"jitter +Inf", "jitter +Inf", "jitter", 9},
		{"jitter NaN", "jitter NaN", "jitter", 9},
		{"jitter huge", "jitter 1e300", "jitter", 9},
		{"jitter above 10", "jitter 10.5", "jitter", 9},
		{"log_sample NaN", "log_sample NaN", "log_sample", 9},
		{"log_sample inf", "log_sample inf", "log_sample", 9},
		{"sweep_interval under 1s", "sweep_interval 500ms", "sweep_interval", 9},
		{"local_quota NaN", "local_quota NaN", "local_quota", 6},
		{"local_quota inf", "local_quota inf", "local_quota", 6},
		{"deny_cache under 1ms", "deny_cache 500us", "deny_cache", 6},
		{"window under 1ms", "window 500us", "window", 7},
		{"timeout under 1ms", "timeout 100us", "timeout", 11},
		{"dial_timeout under 1ms", "dial_timeout 10us", "dial_timeout", 11},
		{"breaker_after under 1ms", "breaker_after 1us", "breaker_after", 11},
		{"breaker_open_for under 1ms", "breaker_open_for 999us", "breaker_open_for", 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := strings.Split(site, "\n")
			lines[tc.line-1] = strings.Repeat("\t", strings.Count(lines[tc.line-1], "\t")) + tc.option
			input := strings.Join(lines, "\n")
			adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
			if _, _, err := adapter.Adapt([]byte(site), nil); err != nil {
				t.Fatalf("the unchanged site does not adapt: %v", err)
			}
			_, _, err := adapter.Adapt([]byte(input), nil)
			if err == nil {
				t.Fatalf("adapted:\n%s", input)
			}
			for _, want := range []string{tc.field, fmt.Sprintf(":%d", tc.line)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestCaddyfileRefusesNegativeJWTDurations: the jwt block's durations are
// refused negative at their line, as Validate refuses them in JSON.
func TestCaddyfileRefusesNegativeJWTDurations(t *testing.T) {
	runParseErrorCases(t, []parseErrorCase{
		{"negative leeway", "rate_limit {\n zone a {\n  rate 1/s\n }\n jwt {\n  secret s\n  leeway -1s\n }\n}", []string{"leeway", ":7"}},
		{"negative jwks_refresh", "rate_limit {\n zone a {\n  rate 1/s\n }\n jwt {\n  jwks_url https://idp.test/jwks\n  jwks_refresh -1m\n }\n}", []string{"jwks_refresh", ":7"}},
	})
}

// TestRedisEmptyPlaceholderRefused: a redis block value whose placeholder
// resolves empty (an unset {env.*}) refuses the config at Provision,
// naming the field, as the jwt block's secret does; a set variable loads.
func TestRedisEmptyPlaceholderRefused(t *testing.T) {
	addr := testutil.ClosedAddr(t)
	for _, tc := range []struct{ field, block string }{
		{"password", "addresses " + addr + "\n  password {env.FLOODGATE_TEST_UNSET_REDIS_PASSWORD}"},
		{"username", "addresses " + addr + "\n  username {env.FLOODGATE_TEST_UNSET_REDIS_USER}\n  password p"},
		{"url", "url {env.FLOODGATE_TEST_UNSET_REDIS_URL}"},
		{"addresses", "addresses {env.FLOODGATE_TEST_UNSET_REDIS_ADDR}"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			h := new(Handler)
			input := "rate_limit {\n zone z {\n  rate 5/m\n  store redis\n }\n redis {\n  " + tc.block + "\n }\n}"
			if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			err := h.Provision(ctx)
			if err == nil {
				_ = h.Cleanup()
				t.Fatalf("provisioned with an empty %s", tc.field)
			}
			for _, want := range []string{tc.field, "empty"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
	t.Setenv("FLOODGATE_TEST_SET_REDIS_PASSWORD", "p")
	provisionHandler(t, "rate_limit {\n zone z {\n  rate 5/m\n  store redis\n }\n redis {\n  addresses "+addr+"\n  password {env.FLOODGATE_TEST_SET_REDIS_PASSWORD}\n }\n}")
}

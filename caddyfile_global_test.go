package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestCaddyfileRedisGlobal: the redis block's global block parses the
// redis block's options and region_quota, adapts to "global" in JSON and
// reaches its own client settings; its timeout and region_quota have
// their own defaults.
func TestCaddyfileRedisGlobal(t *testing.T) {
	out, h := adaptRedisBlock(t, "url redis://127.0.0.1:6379\nglobal {\n\turl redis://10.0.0.9:6379\n\tregion_quota 0.25\n\ttimeout 250ms\n\tpassword s3cret\n\tkey_prefix fg:\n\ttls {\n\t\tserver_name global.internal\n\t}\n}")
	for _, want := range []string{`"global":{"key_prefix":"fg:"`, `"url":"redis://10.0.0.9:6379"},"url":"redis://127.0.0.1:6379"`, `"password":"s3cret"`, `"timeout":250000000`, `"key_prefix":"fg:"`, `"tls_server_name":"global.internal"`, `"region_quota":0.25`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
	g := h.Redis.Global
	if g == nil {
		t.Fatal("no global block parsed")
	}
	if g.regionQuota() != 0.25 || g.timeout() != 250*time.Millisecond || !g.TLS {
		t.Errorf("global %+v: want region_quota 0.25, timeout 250ms, tls", g)
	}
	key := g.poolKey()
	if key.Client.URL != "redis://10.0.0.9:6379" || key.Client.Password != "s3cret" || key.Client.TLSOptions.ServerName != "global.internal" {
		t.Errorf("global's client settings %+v", key.Client)
	}
	if h.Redis.poolKey().Client.URL != "redis://127.0.0.1:6379" {
		t.Errorf("the region's client settings changed: %+v", h.Redis.poolKey().Client)
	}

	def := GlobalRedisConfig{RedisConfig: RedisConfig{URL: "redis://10.0.0.9:6379"}}
	if def.regionQuota() != defaultRegionQuota || def.timeout() != defaultGlobalTimeout {
		t.Errorf("defaults: region_quota %v, timeout %v", def.regionQuota(), def.timeout())
	}
	if err := def.validate(); err != nil {
		t.Errorf("a global block with a url is refused: %v", err)
	}
	// JSON is checked as the Caddyfile is.
	for _, g := range []GlobalRedisConfig{
		{RegionQuota: 0.5},
		{RedisConfig: def.RedisConfig, RegionQuota: 1.5},
		{RedisConfig: def.RedisConfig, RegionQuota: -0.1},
		{RedisConfig: RedisConfig{URL: def.URL, Timeout: caddy.Duration(time.Microsecond)}},
		{RedisConfig: RedisConfig{URL: def.URL, OverridesRefresh: caddy.Duration(time.Second)}},
		{RedisConfig: RedisConfig{URL: def.URL, Global: &GlobalRedisConfig{RedisConfig: def.RedisConfig}}},
	} {
		rc := RedisConfig{URL: "redis://127.0.0.1:6379", Global: &g}
		if err := rc.validate(); err == nil || !strings.Contains(err.Error(), "global") {
			t.Errorf("%+v: refusal %v does not name global", g, err)
		}
	}
}

// TestCaddyfileRedisGlobalRefusals: a global block without a server, with
// a region_quota outside (0, 1] or an option that does not apply, and a
// zone whose algorithm a region cannot share, are refused with the line.
func TestCaddyfileRedisGlobalRefusals(t *testing.T) {
	site := func(algorithm, global string) string {
		return "rate_limit {\n zone a {\n  rate 5/s\n  algorithm " + algorithm + "\n  store redis\n }\n redis {\n  url redis://127.0.0.1:6379\n  global {\n   " +
			strings.ReplaceAll(global, "\n", "\n   ") + "\n  }\n }\n}"
	}
	const url = "url redis://127.0.0.1:6380"
	runParseErrorCases(t, []parseErrorCase{
		{"no url", site("fixed_window", "region_quota 0.5"), []string{"redis: global", "url", ":9"}},
		{"zero region_quota", site("fixed_window", url+"\nregion_quota 0"), []string{"redis: global", "region_quota", ":11"}},
		{"region_quota above 1", site("fixed_window", url+"\nregion_quota 1.5"), []string{"region_quota", ":11"}},
		{"negative region_quota", site("fixed_window", url+"\nregion_quota -0.5"), []string{"region_quota", ":11"}},
		{"region_quota not a number", site("fixed_window", url+"\nregion_quota half"), []string{"region_quota", ":11"}},
		{"overrides_refresh", site("fixed_window", url+"\noverrides_refresh 1s"), []string{"redis: global", "unknown option 'overrides_refresh'", ":11"}},
		{"nested global", site("fixed_window", url+"\nglobal {\n url redis://x:1\n}"), []string{"redis: global", "unknown option 'global'", ":11"}},
		{"tls block", site("fixed_window", url+"\ntls {\n cert client.pem\n}"), []string{"redis: global: tls", ":11"}},
		{"short timeout", site("fixed_window", url+"\ntimeout 1us"), []string{"redis: global", "timeout", ":11"}},
		{"leaky_bucket", site("leaky_bucket", url), []string{"zone a", "global", "leaky_bucket", ":2"}},
		{"concurrency", site("concurrency", url), []string{"zone a", "global", "concurrency", ":2"}},
		{"arguments", strings.Replace(site("fixed_window", url), "global {", "global now {", 1), []string{"redis", "global", ":9"}},
	})
	for _, alg := range []string{"fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket"} {
		if _, err := parseDirective(t, site(alg, url+"\nregion_quota 1")); err != nil {
			t.Errorf("%s with global refused: %v", alg, err)
		}
	}
	calendar := "rate_limit {\n zone a {\n  events 100\n  calendar month\n  store redis\n }\n redis {\n  url redis://127.0.0.1:6379\n  global {\n   " + url + "\n  }\n }\n}"
	if _, err := parseDirective(t, calendar); err != nil {
		t.Errorf("a calendar zone with global refused: %v", err)
	}
	// A memory zone beside a regional one is not affected.
	mem := strings.Replace(site("leaky_bucket", url), "  store redis\n", "", 1)
	if _, err := parseDirective(t, mem); err != nil {
		t.Errorf("a memory leaky_bucket zone beside global refused: %v", err)
	}
	// JSON: the handler's check refuses what the parser does.
	h := &Handler{
		RateLimits: map[string]*Zone{"a": {Algorithm: "leaky_bucket", MaxEvents: 5, Window: caddy.Duration(time.Second), Store: storeRedis}},
		Redis:      &RedisConfig{URL: "redis://127.0.0.1:6379", Global: &GlobalRedisConfig{RedisConfig: RedisConfig{URL: "redis://127.0.0.1:6380"}}},
	}
	if err := h.validate(); err == nil || !strings.Contains(err.Error(), "global") {
		t.Errorf("a JSON leaky_bucket zone with global: refusal %v", err)
	}
}

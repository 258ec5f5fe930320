package ratelimit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestCaddyfileRedisTimings: dial_timeout, breaker_after and
// breaker_open_for parse from the redis block, adapt to their JSON names,
// and reach the client settings and the pool key, so a reload that changes
// any of them gets a client of its own.
func TestCaddyfileRedisTimings(t *testing.T) {
	out, h := adaptRedisBlock(t, "url redis://127.0.0.1:6379\ndial_timeout 2s\nbreaker_after 300ms\nbreaker_open_for 3s")
	wantAdapted(t, out, `"dial_timeout":2000000000`, `"breaker_after":300000000`, `"breaker_open_for":3000000000`)
	key := h.Redis.poolKey()
	if key.Client.DialTimeout != 2*time.Second || key.Breaker.After != 300*time.Millisecond || key.Breaker.OpenFor != 3*time.Second {
		t.Errorf("pool key %+v, want dial 2s, breaker 300ms and 3s", key)
	}

	// Defaults: a 1s dial unless the url sets one; breaker timings zero,
	// which the limiter reads as its defaults.
	def := RedisConfig{URL: "redis://127.0.0.1:6379"}
	if got := def.poolKey(); got.Client.DialTimeout != defaultDialTimeout || got.Breaker.After != 0 || got.Breaker.OpenFor != 0 {
		t.Errorf("default pool key %+v", got)
	}
	if got := (&RedisConfig{URL: "redis://127.0.0.1:6379?dial_timeout=3s"}).resolved(); got.DialTimeout != 0 {
		t.Errorf("dial_timeout %v overrides the url's", got.DialTimeout)
	}
	mk := func(c RedisConfig) string {
		raw, _ := json.Marshal(c.poolKey())
		return string(raw)
	}
	changed := def
	changed.BreakerOpenFor = caddy.Duration(time.Second)
	if mk(def) == mk(changed) {
		t.Error("a breaker_open_for change keeps the pool key: a reload would keep the old breaker")
	}

	// JSON configs are checked by Validate.
	for _, c := range []RedisConfig{
		{URL: def.URL, DialTimeout: -1},
		{URL: def.URL, BreakerAfter: -1},
		{URL: def.URL, BreakerOpenFor: -1},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("%+v validated", c)
		}
	}
}

// TestCaddyfileRedisTimingErrors: bad timings are refused with the line.
func TestCaddyfileRedisTimingErrors(t *testing.T) {
	block := func(opt string) string {
		return "rate_limit {\n zone a {\n  rate 5/s\n  store redis\n }\n redis {\n  url redis://127.0.0.1:6379\n  " + opt + "\n }\n}"
	}
	runParseErrorCases(t, []parseErrorCase{
		{"negative dial_timeout", block("dial_timeout -1s"), []string{"dial_timeout", ":8"}},
		{"zero breaker_after", block("breaker_after 0s"), []string{"breaker_after", "positive", ":8"}},
		{"negative breaker_open_for", block("breaker_open_for -250ms"), []string{"breaker_open_for", ":8"}},
		{"bad duration", block("breaker_after soon"), []string{"breaker_after", "duration", ":8"}},
		{"missing value", block("dial_timeout"), []string{":8"}},
	})
}

// TestCaddyfileRedisShards: shards parse from the redis block, adapt to
// their JSON name, and reach the client settings with the block's other
// options and its placeholders resolved; one left unset refuses the
// config, naming shards.
func TestCaddyfileRedisShards(t *testing.T) {
	out, h := adaptRedisBlock(t, "shards 10.0.0.1:6379 {env.FLOODGATE_TEST_SHARD} 10.0.0.3:6379\npassword s3cret\ndb 2")
	wantAdapted(t, out, `"shards":["10.0.0.1:6379","{env.FLOODGATE_TEST_SHARD}","10.0.0.3:6379"]`)
	if err := h.Redis.checkResolved(); err == nil || !strings.Contains(err.Error(), "shards") {
		t.Errorf("an unset shard placeholder: %v, want shards refused", err)
	}
	t.Setenv("FLOODGATE_TEST_SHARD", "10.0.0.2:6379")
	got := h.Redis.resolved()
	if strings.Join(got.Shards, " ") != "10.0.0.1:6379 10.0.0.2:6379 10.0.0.3:6379" || got.Password != "s3cret" || got.DB != 2 || got.URL != "" || len(got.Addresses) != 0 {
		t.Errorf("client settings %+v", got)
	}
}

func TestRedisAndJWTBlocksParse(t *testing.T) {
	h, err := parseDirective(t, `rate_limit {
		zone z {
			key jwt_claim org.id
			rate 5/s
			store redis
			fail local
		}
		redis {
			addresses 127.0.0.1:7000 127.0.0.1:7001
			master_name mymaster
			username u
			password {env.REDIS_PASSWORD}
			sentinel_username su
			sentinel_password {env.SENTINEL_PASSWORD}
			tls insecure_skip_verify
			timeout 10ms
			pool_size 20
			key_prefix fg:
		}
		jwt {
			secret {env.JWT_SECRET}
			issuer https://issuer.example
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Redis
	if len(r.Addresses) != 2 || r.MasterName != "mymaster" || r.Username != "u" || r.Password != "{env.REDIS_PASSWORD}" ||
		r.SentinelUsername != "su" || r.SentinelPassword != "{env.SENTINEL_PASSWORD}" || !r.TLS ||
		!r.InsecureSkipVerify || r.PoolSize != 20 || r.KeyPrefix != "fg:" || r.Timeout == 0 {
		t.Fatalf("redis block parsed as %+v", r)
	}
	if z := h.RateLimits["z"]; z.Key != "{jwt.org.id}" || z.Store != "redis" || z.Fail != "local" {
		t.Fatalf("zone parsed as %+v", z)
	}
	if h.JWT == nil {
		t.Fatal("jwt block lost")
	}
	t.Setenv("SENTINEL_PASSWORD", "from-env")
	if got := r.resolved(); got.SentinelUsername != "su" || got.SentinelPassword != "from-env" {
		t.Errorf("sentinel credentials resolved as %q, %q", got.SentinelUsername, got.SentinelPassword)
	}
}

func TestRedisConfigErrorsNameLine(t *testing.T) {
	runParseErrorCases(t, []parseErrorCase{
		{"store redis without block", "rate_limit {\n zone a {\n  rate 1/s\n  store redis\n }\n}", []string{"zone a: ", "redis block", ":2"}},
		{"unknown redis option", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  url redis://127.0.0.1:6379\n  flavour cherry\n }\n}", []string{"flavour", ":7"}},
		{"bad url", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  url http://nope\n }\n}", []string{"url", ":6"}},
		{"no address", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  timeout 1s\n }\n}", []string{"redis: url, addresses or shards is required", ":5"}},
		{"sentinel_password without master_name", "rate_limit {\n zone a {\n  rate 1/s\n }\n redis {\n  addresses 127.0.0.1:26379\n  sentinel_password s\n }\n}", []string{"redis: ", "master_name", ":5"}},
		{"fail on memory", "rate_limit {\n zone a {\n  rate 1/s\n  fail closed\n }\n}", []string{"zone a: ", "fail", ":2"}},
		{"bad fail mode", "rate_limit {\n zone a {\n  rate 1/s\n  store redis\n  fail maybe\n }\n redis {\n  url redis://127.0.0.1:1\n }\n}", []string{"zone a: ", "fail", ":2"}},
		{"jwt_claim without jwt", "rate_limit {\n zone a {\n  key jwt_claim sub\n  rate 1/s\n }\n}", []string{"zone a: ", "jwt", ":2"}},
		{"tier without values", "rate_limit {\n zone a {\n  rate 1/s\n  tier {plan} {\n  }\n }\n}", []string{"tier", ":5"}},
		{"tier bad rate", "rate_limit {\n zone a {\n  rate 1/s\n  tier {plan} {\n   pro lots\n  }\n }\n}", []string{"zone a: option 'tier': value 'pro': want <events>/<duration>", ":5"}},
		{"tier cost too high", "rate_limit {\n zone a {\n  rate 5/s\n  cost 3\n  tier {plan} {\n   free 2/s\n  }\n }\n}", []string{"zone a: ", "cost", ":2"}},
	})
}

// TestCaddyfileRedisGlobal: the redis block's global block parses the
// redis block's options and region_quota, adapts to "global" in JSON and
// reaches its own client settings; its timeout and region_quota have
// their own defaults.
func TestCaddyfileRedisGlobal(t *testing.T) {
	out, h := adaptRedisBlock(t, "url redis://127.0.0.1:6379\nglobal {\n\turl redis://10.0.0.9:6379\n\tregion_quota 0.25\n\ttimeout 250ms\n\tpassword s3cret\n\tkey_prefix fg:\n\ttls {\n\t\tserver_name global.internal\n\t}\n}")
	wantAdapted(t, out, `"global":{"key_prefix":"fg:"`, `"url":"redis://10.0.0.9:6379"},"url":"redis://127.0.0.1:6379"`, `"password":"s3cret"`, `"timeout":250000000`, `"key_prefix":"fg:"`, `"tls_server_name":"global.internal"`, `"region_quota":0.25`)
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

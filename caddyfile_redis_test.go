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
	for _, want := range []string{`"dial_timeout":2000000000`, `"breaker_after":300000000`, `"breaker_open_for":3000000000`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
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
	if want := `"shards":["10.0.0.1:6379","{env.FLOODGATE_TEST_SHARD}","10.0.0.3:6379"]`; !strings.Contains(string(out), want) {
		t.Errorf("adapted JSON lacks %s:\n%s", want, out)
	}
	if err := h.Redis.checkResolved(); err == nil || !strings.Contains(err.Error(), "shards") {
		t.Errorf("an unset shard placeholder: %v, want shards refused", err)
	}
	t.Setenv("FLOODGATE_TEST_SHARD", "10.0.0.2:6379")
	got := h.Redis.resolved()
	if strings.Join(got.Shards, " ") != "10.0.0.1:6379 10.0.0.2:6379 10.0.0.3:6379" || got.Password != "s3cret" || got.DB != 2 || got.URL != "" || len(got.Addresses) != 0 {
		t.Errorf("client settings %+v", got)
	}
}

package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestProvisionRefusesBeforeAcquiring: a config that validate refuses is
// refused by Provision before it acquires anything, so it leaves the
// running config as it was: the memory store the two configs' zone
// shares keeps its max_keys, and the refused handler's zone is never
// listed for the admin API. (Caddy would call a Validate only after
// Provision, once the store had been resized.)
func TestProvisionRefusesBeforeAcquiring(t *testing.T) {
	running := provisionHandler(t, "rate_limit {\n zone shared_refused {\n  events 5\n  window 1m\n }\n max_keys 2\n}")
	mem, ok := running.zones[0].limit.store.(*limiter.Memory)
	if !ok {
		t.Fatalf("store %T, want the memory store", running.zones[0].limit.store)
	}
	for _, bad := range []string{
		`"jitter":11`,
		`"headers":"some"`,
		`"redis":{"url":"redis://127.0.0.1:1","addresses":["127.0.0.1:1"]}`,
		`"jwt":{"secret":"s","public_key":"k.pem"}`,
	} {
		t.Run(bad, func(t *testing.T) {
			var h Handler
			raw := fmt.Sprintf(`{"rate_limits":{"shared_refused":{"max_events":5,"window":"1m"}},"max_keys":1000,%s}`, bad)
			if err := json.Unmarshal([]byte(raw), &h); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			err := h.Provision(ctx)
			// As Caddy does after a failed Provision.
			_ = h.Cleanup()
			if err == nil {
				t.Fatalf("provisioned %s", raw)
			}
			if len(h.zones) != 0 || h.redisKey != "" || h.jwt != nil {
				t.Errorf("the refused handler acquired %d zones, redis %q, jwt %v", len(h.zones), h.redisKey, h.jwt)
			}
			if n := len(zones.named("shared_refused")); n != 1 {
				t.Errorf("%d zones listed as shared_refused, want the running config's one", n)
			}
			for i := range 5 {
				if _, err := mem.Take(context.Background(), fmt.Sprintf("k%d", i), 1); err != nil {
					t.Fatal(err)
				}
			}
			if n := mem.Len(); n > 2 {
				t.Errorf("the shared store holds %d keys: the refused config changed the running one's max_keys 2", n)
			}
		})
	}
}

// TestJSONRefusalsNameTheBlock: a JSON config's refusal of a redis or jwt
// block comes from the package that owns the fields (limiter, jwtauth),
// in its words, with the block named once.
func TestJSONRefusalsNameTheBlock(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{`"redis":{"timeout":"5ms"}`, "redis: url, addresses or shards is required"},
		{`"redis":{"addresses":["a:1","b:2"],"db":3}`, "redis: db 3: Redis Cluster has only database 0"},
		{`"redis":{"url":"redis://h","sentinel_password":"p"}`, "redis: sentinel_username and sentinel_password need master_name"},
		{`"redis":{"shards":["a:1","b:1"],"master_name":"m"}`, "redis: shards cannot be set with url, addresses or master_name"},
		{`"redis":{"shards":["a:1","a:1"]}`, "redis: shards lists a:1 twice"},
		{`"jwt":{}`, "jwt: one of secret, public_key or jwks_url is required"},
		{`"jwt":{"secret":"s","jwks_refresh":"1h"}`, "jwt: jwks_refresh needs jwks_url"},
		{`"jwt":{"secret":"s","from":{"header":"a","cookie":"b"}}`, "jwt: from must name exactly one of header, cookie or query"},
	} {
		var h Handler
		raw := fmt.Sprintf(`{"rate_limits":{"z":{"max_events":5,"window":"1m"}},%s}`, tc.block)
		if err := json.Unmarshal([]byte(raw), &h); err != nil {
			t.Fatal(err)
		}
		err := h.validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: refusal %v, want one starting %q", tc.block, err, tc.want)
		}
	}
}

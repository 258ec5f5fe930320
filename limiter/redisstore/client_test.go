package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestRedisConfigOptions(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		check func(t *testing.T, o *redis.UniversalOptions)
	}{
		{"url", Config{URL: "redis://user:secret@cache.internal:6380/2?dial_timeout=2s&pool_size=7"},
			func(t *testing.T, o *redis.UniversalOptions) {
				if len(o.Addrs) != 1 || o.Addrs[0] != "cache.internal:6380" || o.Username != "user" || o.Password != "secret" ||
					o.DB != 2 || o.DialTimeout != 2*time.Second || o.PoolSize != 7 || o.TLSConfig != nil {
					t.Errorf("got %+v", o)
				}
			}},
		{"url default port", Config{URL: "redis://localhost"},
			func(t *testing.T, o *redis.UniversalOptions) {
				if o.Addrs[0] != "localhost:6379" {
					t.Errorf("addrs %v", o.Addrs)
				}
			}},
		{"rediss", Config{URL: "rediss://cache.internal", InsecureSkipVerify: true},
			func(t *testing.T, o *redis.UniversalOptions) {
				if o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.internal" || !o.TLSConfig.InsecureSkipVerify {
					t.Errorf("tls %+v", o.TLSConfig)
				}
			}},
		{"fields override url", Config{URL: "redis://a:b@h/1", Username: "u", Password: "p", DB: 3, PoolSize: 9, DialTimeout: time.Second, TLS: true},
			func(t *testing.T, o *redis.UniversalOptions) {
				if o.Username != "u" || o.Password != "p" || o.DB != 3 || o.PoolSize != 9 || o.DialTimeout != time.Second || o.TLSConfig == nil {
					t.Errorf("got %+v", o)
				}
			}},
		{"one address", Config{Addresses: []string{"127.0.0.1:6379"}, DB: 4},
			func(t *testing.T, o *redis.UniversalOptions) {
				if len(o.Addrs) != 1 || o.MasterName != "" || o.DB != 4 {
					t.Errorf("got %+v", o)
				}
			}},
		{"cluster", Config{Addresses: []string{"a:1", "b:2", "c:3"}, Password: "p"},
			func(t *testing.T, o *redis.UniversalOptions) {
				if len(o.Addrs) != 3 || o.MasterName != "" || o.Password != "p" {
					t.Errorf("got %+v", o)
				}
			}},
		{"sentinel", Config{Addresses: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster", DB: 1, Password: "p", SentinelUsername: "su", SentinelPassword: "sp"},
			func(t *testing.T, o *redis.UniversalOptions) {
				if o.MasterName != "mymaster" || len(o.Addrs) != 2 || o.DB != 1 || o.Password != "p" ||
					o.SentinelUsername != "su" || o.SentinelPassword != "sp" {
					t.Errorf("got %+v", o)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.cfg.options()
			if err != nil {
				t.Fatal(err)
			}
			if !o.ContextTimeoutEnabled {
				t.Error("ContextTimeoutEnabled is off: the store's timeout would not apply")
			}
			tt.check(t, o)
		})
	}
}

func TestRedisConfigClientKinds(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "redis://127.0.0.1:1"}, "*redis.Client"},
		{Config{Addresses: []string{"127.0.0.1:1"}}, "*redis.Client"},
		{Config{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.ClusterClient"},
		{Config{Addresses: []string{"127.0.0.1:1"}, MasterName: "m"}, "*redis.Client"},
		{Config{Shards: []string{"127.0.0.1:1"}}, "*redis.Ring"},
		{Config{Shards: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "*redis.Ring"},
	} {
		c, err := tt.cfg.NewClient()
		if err != nil {
			t.Fatalf("%+v: %v", tt.cfg, err)
		}
		var got string
		switch c.(type) {
		case *redis.Client:
			got = "*redis.Client"
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
		case *redis.Ring:
			got = "*redis.Ring"
		default:
			got = "other"
		}
		if got != tt.want {
			t.Errorf("%+v: client %s, want %s", tt.cfg, got, tt.want)
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

func TestRedisConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "url, addresses or shards is required"},
		{Config{URL: "redis://h", Shards: []string{"a:1"}}, "shards cannot be set with url"},
		{Config{Addresses: []string{"a:1"}, Shards: []string{"b:1"}}, "shards cannot be set with url, addresses"},
		{Config{Shards: []string{"a:1", ""}}, "shards holds an empty address"},
		{Config{Shards: []string{"a:1", "b:1", "a:1"}}, "shards lists a:1 twice"},
		{Config{Shards: []string{"a:1"}, SentinelPassword: "sp"}, "master_name"},
		{Config{Shards: []string{"a:1"}, InsecureSkipVerify: true}, "insecure_skip_verify"},
		{Config{URL: "redis://h", Addresses: []string{"h:1"}}, "cannot both be set"},
		{Config{URL: "redis://h", MasterName: "m"}, "master_name"},
		{Config{Addresses: []string{"h:26379"}, SentinelPassword: "sp"}, "master_name"},
		{Config{URL: "unix:///tmp/redis.sock"}, "scheme"},
		{Config{URL: "http://h"}, "scheme"},
		{Config{URL: "redis://u:hunter2@h/x"}, "database"},
		{Config{URL: "redis://u:hunter2@h:port/0"}, "parsing url"},
		{Config{Addresses: []string{"a:1", "b:2"}, DB: 1}, "only database 0"},
		{Config{Addresses: []string{""}}, "empty address"},
		{Config{Addresses: []string{"a:1"}, InsecureSkipVerify: true}, "insecure_skip_verify"},
		{Config{Addresses: []string{"a:1"}, PoolSize: -1}, "pool_size"},
		{Config{Addresses: []string{"a:1"}, DialTimeout: -time.Second}, "dial_timeout"},
		{Config{Addresses: []string{"a:1"}, DB: -1}, "db"},
		{Config{Addresses: []string{"a:1"}, DB: MaxDB + 1}, "db"},
	} {
		_, err := tt.cfg.NewClient()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want one containing %q", tt.cfg, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%+v: error %q reveals the password", tt.cfg, err)
		}
	}
}

// TestRedisConfigValidateTakesPlaceholders: Validate, which the adapter
// runs on its redis block before placeholders are resolved, refuses
// contradictions but not a url it cannot parse yet; NewClient parses it.
func TestRedisConfigValidateTakesPlaceholders(t *testing.T) {
	c := Config{URL: "{env.REDIS_URL}", InsecureSkipVerify: true}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate refused a url placeholder: %v", err)
	}
	if _, err := c.NewClient(); err == nil || !strings.HasPrefix(err.Error(), "redis config: ") {
		t.Fatalf("NewClient error %v, want the unresolved url refused with context", err)
	}
	c.Addresses = []string{"{env.REDIS_ADDR}"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cannot both be set") {
		t.Fatalf("Validate error %v, want url and addresses refused together", err)
	}
}

package limiter

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestReviewRingSendsNoClientSetinfo: RedisConfig.options sets
// DisableIdentity, and the README promises "Floodgate sends no CLIENT
// SETINFO" (the ACL rule cannot grant it on 7.0; later servers log every
// denial). newRing copies the options field by field and leaves
// DisableIdentity out, so every shard connection sends CLIENT SETINFO.
func TestReviewRingSendsNoClientSetinfo(t *testing.T) {
	c, err := RedisConfig{Shards: []string{"127.0.0.1:1", "127.0.0.1:2"}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ring := c.(*redis.Ring)
	for _, s := range ring.GetShardClients() {
		if !s.Options().DisableIdentity {
			t.Errorf("shard %s: DisableIdentity false: its connections send CLIENT SETINFO", s.Options().Addr)
		}
	}
}

package limiter

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// redisCaseStore opens stores on client for runAlgorithmCases: each case gets
// its own zone, and the explicit-time hook replaces Redis TIME.
func redisCaseStore(client redis.UniversalClient) caseStore {
	var n atomic.Int64
	return func(t *testing.T, p Policy) (Store, func(int64)) {
		var now atomic.Int64
		r, err := NewRedis(client, p, RedisOptions{
			Zone:    fmt.Sprintf("case%d-%s", n.Add(1), t.Name()),
			Timeout: 5 * time.Second,
			now:     now.Load,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r, now.Store
	}
}

func TestAlgorithmCasesRedis(t *testing.T) {
	s := redistest.Start(t)
	runAlgorithmCases(t, redisCaseStore(s.Client(t)))
}

func TestAlgorithmCasesRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	runAlgorithmCases(t, redisCaseStore(c.Client(t)))
}

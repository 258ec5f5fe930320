package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// TestRedisOverridesManyWritersAtOnce: 24 writers of different limits on
// one key, 8 on each of 3 instances, 4 rounds: every write lands. An
// instance's own SetGen calls take turns, and a writer whose conditional
// write another instance's write refused reads again, as often as writes
// keep landing. (Guards against: SetGen gave up after 8 refusals, and
// the admin API answered 502 although Redis answered every call: 2 to 30
// of 96 failed.)
func TestRedisOverridesManyWritersAtOnce(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	const instances, perInstance = 3, 8
	var all []testOverrides
	for range instances {
		o := newTestOverrides(t, s.Client(t), OverridesOptions{})
		o.zone(t, "api")
		all = append(all, o)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []error
	)
	for round := range 4 {
		start := make(chan struct{})
		for i, inst := range all {
			for j := range perInstance {
				o := limiter.Override{Action: limiter.OverrideLimit, Events: int64(1 + round*100 + i*perInstance + j), Window: time.Minute}
				keep := func(old limiter.Override) bool { return old.Events == o.Events && old.Window == o.Window }
				wg.Go(func() {
					<-start
					if _, err := inst.SetGen(ctx, "api", "k", o, keep); err != nil {
						mu.Lock()
						failed = append(failed, err)
						mu.Unlock()
					}
				})
			}
		}
		close(start)
		wg.Wait()
	}
	moved := 0
	for _, err := range failed {
		if errors.Is(err, ErrOverrideConflict) {
			moved++
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d concurrent SetGen calls failed over 4 rounds (%d by retry exhaustion), e.g. %v", len(failed), 4*instances*perInstance, moved, failed[0])
	}
}

package limiter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// TestReview25SetGenManyWritersAtOnce (review 25, fails): SetGen gives up
// after maxSetAttempts (8) conditional writes refused by other writers.
// Writers of different limits on one key (a fleet's automation, or an
// operator's script fanning out to several instances' admin APIs) each
// change the record, so under contention some of them never get a write
// in: SetGen fails with "the override was changed by another writer
// meanwhile", which the admin API reports as a 502 Bad Gateway although
// Redis answered every call (4 rounds of 24 writers; 3 of 5 single rounds failed when
// written). Every one of these writes is valid and
// should land (in some order).
func TestReview25SetGenManyWritersAtOnce(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	const instances, perInstance = 3, 8
	var all []testOverrides
	for range instances {
		o := newTestOverrides(t, s.Client(t), RedisOverridesOptions{})
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
				o := Override{Action: OverrideLimit, Events: int64(1 + round*100 + i*perInstance + j), Window: time.Minute}
				keep := func(old Override) bool { return old.Events == o.Events && old.Window == o.Window }
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
		if errors.Is(err, errRecordMoved) {
			moved++
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d concurrent SetGen calls failed over 4 rounds (%d by retry exhaustion), e.g. %v", len(failed), 4*instances*perInstance, moved, failed[0])
	}
}

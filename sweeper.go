package ratelimit

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// sweeper is a handler's housekeeping goroutine: it forgets idle keys of
// its memory stores every sweep interval, and every second moves its
// zones' hot-key counters on (they keep the last minute) and removes
// lapsed overrides. It belongs to one
// handler and stops in its Cleanup.
type sweeper struct {
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// rotateEvery is how often hot-key counters move on: well inside their
// half-minute generations, so a late tick loses nothing.
const rotateEvery = time.Second

func startSweeper(interval time.Duration, zones []*zone, logger *zap.Logger) *sweeper {
	s := &sweeper{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		sweep := time.NewTicker(interval)
		defer sweep.Stop()
		rotate := time.NewTicker(rotateEvery)
		defer rotate.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-sweep.C:
				// Listed each time: a zone builds stores for its
				// overrides as they are set.
				for _, z := range zones {
					for _, m := range z.memories() {
						m.Sweep()
					}
				}
			case <-rotate.C:
				for _, z := range zones {
					z.hot.Rotate()
					z.sweepOverrides(logger)
				}
			}
		}
	}()
	return s
}

// stop ends the sweeper's goroutine and waits for it; safe on nil and twice.
func (s *sweeper) stop() {
	if s == nil {
		return
	}
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
}

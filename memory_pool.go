package ratelimit

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// memoryStores keeps memory stores across config reloads: a store is keyed
// by zone name and policy, so a reload that keeps both finds the old
// counters, and one that changes the policy starts afresh.
var memoryStores = caddy.NewUsagePool()

// pooledMemory lets a memory store live in a caddy.UsagePool.
type pooledMemory struct{ *limiter.Memory }

// Destruct implements caddy.Destructor; a memory store holds nothing but memory.
func (pooledMemory) Destruct() error { return nil }

// loadMemoryStore returns the memory store of the limit state (see
// limiter.StateID) under p, creating it if no running config holds it, and
// the key to release it by. A store is made with the clock of the handler
// that first needs it; stores are shared, so tests that set a clock use
// zone names of their own.
//
// A concurrency store is keyed by its state alone, and each policy decides
// through a view of it (limiter.Memory.Sharing): the requests a key has in
// flight are counted once, whichever of the zone's limits applies to them
// and across a reload that changes the limit.
func loadMemoryStore(state string, p limiter.Policy, maxKeys int, clock limiter.Clock) (*limiter.Memory, string, error) {
	shared := p.Algorithm.Traits().ReleasesOnFinish
	key := state + "\x00" + p.String()
	if shared {
		key = state + "\x00" + string(p.Algorithm)
	}
	v, loaded, err := memoryStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		m, err := limiter.NewMemory(p, limiter.MemoryOptions{MaxKeys: maxKeys, Clock: clock})
		if err != nil {
			return nil, err
		}
		return pooledMemory{m}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("memory store: %w", err)
	}
	m := v.(pooledMemory).Memory
	if loaded {
		m.SetMaxKeys(maxKeys)
	}
	if shared && m.Policy().String() != p.String() {
		if m, err = m.Sharing(p); err != nil {
			releaseMemoryStore(key)
			return nil, "", err
		}
	}
	return m, key, nil
}

func releaseMemoryStore(key string) {
	if key != "" {
		_, _ = memoryStores.Delete(key)
	}
}

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

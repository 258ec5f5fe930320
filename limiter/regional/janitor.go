package regional

import (
	"context"
	"errors"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// janitorEvery is how often the janitor sweeps: a region's idle units
// are back in global within janitorEvery of their lapse.
const janitorEvery = Lifetime / 4

// lateGrace is how long after its lapse a token bucket's batch rest
// still goes back whole (Store.lateRest): the janitor's tick, and as
// much again for a tick that comes late on a busy machine.
const lateGrace = 2 * janitorEvery

// janitor returns the unspent units of the batches this instance
// installed once they lapse, every janitorEvery.
func (s *Store) janitor() {
	defer close(s.stopped)
	tick := time.NewTicker(janitorEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.sweep(context.Background(), false)
		}
	}
}

// sweep drains the lapsed batches this instance installed (every one,
// lapsed or not, when all is set) from the pool and returns their units
// to global in one call. A batch that another instance's refill replaced
// is that instance's to return (Pool.Fill hands it the rest).
func (s *Store) sweep(ctx context.Context, all bool) {
	now := s.now()
	type due struct {
		key string
		b   filledBatch
	}
	var dues []due
	s.mu.Lock()
	for key, b := range s.filled {
		if all || now >= b.lapses {
			dues = append(dues, due{key, b})
		}
	}
	s.mu.Unlock()
	var returns []limiter.Return
	for _, d := range dues {
		dr, err := s.pool.Drain(ctx, d.key, d.b.mark, all)
		if err != nil {
			s.failed(err)
			continue // the next sweep tries again
		}
		if dr.Outcome == DrainLater {
			continue
		}
		s.mu.Lock()
		if s.filled[d.key] == d.b {
			delete(s.filled, d.key)
		}
		s.mu.Unlock()
		if dr.Outcome != DrainTaken {
			continue
		}
		if units := s.lateRest(dr.Units, now-d.b.lapses); units > 0 {
			returns = append(returns, limiter.Return{Key: d.key, Units: units, Taken: globalReceipt(d.b.mark, d.b.epoch)})
		}
	}
	if len(returns) > 0 {
		s.returnToGlobal(returns)
	}
}

// Close returns every batch this instance installed to global, lapsed or
// not, and stops its janitor; it waits for the returns until ctx is done.
// The region's other instances refill as they need. The store still
// decides afterwards: Caddy may route requests to a handler after its
// Cleanup.
func (s *Store) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
	s.sweep(ctx, true)
	done := make(chan struct{})
	go func() {
		s.returning.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return errors.Join(errors.New("regional store: batches still being returned"), ctx.Err())
	}
}

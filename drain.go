package ratelimit

import (
	"sync/atomic"
	"time"
)

// When a config is replaced, Caddy provisions the new one, stops the old
// servers from accepting connections and cleans the old config up at once,
// without waiting for it to finish serving: requests in flight, and
// requests already being read on the old servers' connections, still run
// through the old handler after its Cleanup. The handler therefore keeps
// limiting after Cleanup (see docs/operations.md, "State and reloads"): its memory stores are
// shared with the new config or live on unreferenced, and its Redis client,
// which the last user closes, is handed back only once the old handler is
// done with it, within these bounds.
const (
	// releaseGrace is how long after Cleanup the client is kept however
	// idle the handler looks: a request still being read on an old
	// connection has not entered the handler yet.
	releaseGrace = time.Second
	// releaseMax bounds the wait for requests in flight, such as long
	// downloads holding a concurrency slot, so a handler that never goes
	// idle cannot keep a replaced client and its connections forever.
	// Past it their decisions, and the release of their slots, apply the
	// zone's fail mode (a slot then lapses a window after its last
	// renewal).
	releaseMax = time.Minute
	// releasePoll is how often the in-flight count is checked once the
	// grace has passed.
	releasePoll = 10 * time.Millisecond
)

// inflight counts the requests a handler is serving, from the first
// decision to the last give-back, so Cleanup can tell when the handler is done.
type inflight struct{ n atomic.Int64 }

func (f *inflight) enter() { f.n.Add(1) }
func (f *inflight) leave() { f.n.Add(-1) }

// releaseWhenIdle runs release on a goroutine of its own once releaseGrace
// has passed and no request is in flight, or once releaseMax has passed.
func (f *inflight) releaseWhenIdle(release func()) {
	go func() {
		start := time.Now()
		time.Sleep(releaseGrace)
		t := time.NewTicker(releasePoll)
		defer t.Stop()
		for f.n.Load() > 0 && time.Since(start) < releaseMax {
			<-t.C
		}
		release()
	}()
}

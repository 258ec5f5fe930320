package redisstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Concurrent decisions of one Redis store share round trips. A decision
// that finds fewer than redisRoundTrips round trips under way runs its
// script at once, alone, as a lone request would; one that arrives while
// they are all under way joins a queue, and the next round trip to finish
// sends the queue (up to redisMaxPipeline calls) as one pipeline. A lone
// request therefore waits for nothing, and under load Redis and the client
// read and write many scripts per system call instead of one: with 64
// callers on one local redis-server this about halves Redis's CPU per
// decision and cuts the client's by 60% (see BENCHMARKS.md). Every script
// is still its own atomic EVALSHA; a pipeline only shares the socket.

// redisRoundTrips bounds how many round trips one store has under way. Redis
// runs one script at a time, so more would only shrink the pipelines.
const redisRoundTrips = 4

// redisMaxPipeline bounds the scripts in one pipeline. Redis runs a pipeline's
// scripts back to back, some 5–10 µs each, and every decision in it waits
// for the whole reply: 64 keep that well inside the default 5 ms timeout.
const redisMaxPipeline = 64

// scriptCall is one decision on its way to Redis.
type scriptCall struct {
	ctx  context.Context
	key  string
	args []any
	// argv holds args without an allocation of their own for every
	// algorithm's arguments.
	argv  [9]any
	reply []int64
	err   error
	// done is closed when reply and err are set, for a call that waits in
	// the queue; a call that runs at once needs no channel.
	done chan struct{}
}

// pipeliner queues the calls of one store while its round trips are
// busy, and sends the queue as one pipeline.
type pipeliner struct {
	mu      sync.Mutex
	queue   []*scriptCall
	running int // round trips under way, at most redisRoundTrips
	// pipelined counts the calls sent in pipelines of two or more, so
	// tests can tell that load did share round trips.
	pipelined atomic.Int64
	// runOne and runMany send one call, or a pipeline of them, and set
	// their replies.
	runOne  func(*scriptCall)
	runMany func([]*scriptCall)
}

// do runs c and returns its reply when it has one, or the context's error
// when c.ctx is done first: a queued call then leaves the round trip that
// takes the queue to skip it, or to run it without telling anyone.
func (p *pipeliner) do(c *scriptCall) ([]int64, error) {
	p.mu.Lock()
	if p.running < redisRoundTrips {
		// Nothing is queued (calls queue only while every round trip is
		// under way, and a round trip that ends with a queue takes it on).
		p.running++
		p.mu.Unlock()
		p.runOne(c)
		p.finish()
		return c.reply, c.err
	}
	c.done = make(chan struct{})
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.reply, c.err
	case <-c.ctx.Done():
		// c's fields are the round trip's to write until done closes.
		return nil, c.ctx.Err()
	}
}

// finish ends a round trip: if calls queued meanwhile, a goroutine sends
// them in the round trip's stead, so the caller whose call just came back
// does not wait for others'.
func (p *pipeliner) finish() {
	p.mu.Lock()
	if len(p.queue) == 0 {
		p.running--
		p.mu.Unlock()
		return
	}
	calls := p.take(nil)
	p.mu.Unlock()
	go p.drain(calls)
}

// take moves up to redisMaxPipeline calls from the queue into spare's
// array (a new one when spare is nil). p.mu is held.
func (p *pipeliner) take(spare []*scriptCall) []*scriptCall {
	n := min(len(p.queue), redisMaxPipeline)
	calls := append(spare[:0], p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	return calls
}

// drain sends pipelines until the queue is empty.
func (p *pipeliner) drain(calls []*scriptCall) {
	for {
		live := calls[:0]
		for _, c := range calls {
			if c.ctx.Err() != nil {
				// Its caller has given up: sending it would only take units
				// nobody is told about.
				c.err = c.ctx.Err()
				close(c.done)
				continue
			}
			live = append(live, c)
		}
		switch len(live) {
		case 0:
		case 1:
			p.runOne(live[0])
		default:
			p.pipelined.Add(int64(len(live)))
			p.runMany(live)
		}
		for _, c := range live {
			close(c.done)
		}
		clear(calls)
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.running--
			p.mu.Unlock()
			return
		}
		calls = p.take(calls)
		p.mu.Unlock()
	}
}

// pipelineScripts sends calls as one pipeline of EVALSHA and sets each
// reply. The round trip lasts until the latest of the calls' deadlines:
// every caller still waiting wants its answer. Calls that came back
// NOSCRIPT (Redis restarted or flushed its scripts) did not run; they are
// sent again with the script's source, which also loads it. It reports
// whether any came back NOSCRIPT.
func pipelineScripts(client redis.UniversalClient, script *redis.Script, src string, calls []*scriptCall) (noScript bool) {
	ctx := calls[0].ctx
	latest, _ := ctx.Deadline()
	for _, c := range calls[1:] {
		if dl, ok := c.ctx.Deadline(); ok && dl.After(latest) {
			ctx, latest = c.ctx, dl
		}
	}
	if _, ok := ctx.(decisionContext); !ok {
		// A caller's own context (its deadline came sooner than the
		// store's timeout) may be cancelled when its client leaves, which
		// must not fail the other calls: keep only its deadline.
		ctx = context.WithoutCancel(ctx)
		if !latest.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, latest)
			defer cancel()
		}
	}
	cmds := make([]*redis.Cmd, len(calls))
	pipe, sha := client.Pipeline(), script.Hash()
	for i, c := range calls {
		cmds[i] = pipe.EvalSha(ctx, sha, []string{c.key}, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	var again redis.Pipeliner
	for i, c := range calls {
		if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			if again == nil {
				again = client.Pipeline()
			}
			cmds[i] = again.Eval(ctx, src, []string{c.key}, c.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for i, c := range calls {
		c.reply, c.err = cmds[i].Int64Slice()
	}
	return again != nil
}

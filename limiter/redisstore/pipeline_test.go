package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// fakeRounds stands in for Redis behind a pipeliner: lone calls block
// until released, pipelines are recorded, and every call is answered with
// its first argument.
type fakeRounds struct {
	release   chan struct{}
	mu        sync.Mutex
	pipelines [][]any
}

func newFakePipeliner(f *fakeRounds) *pipeliner {
	answer := func(c *scriptCall) { c.reply = []int64{c.args[0].(int64)} }
	return &pipeliner{
		runOne: func(c *scriptCall) {
			<-f.release
			answer(c)
		},
		runMany: func(calls []*scriptCall) {
			var ids []any
			for _, c := range calls {
				ids = append(ids, c.args[0])
				answer(c)
			}
			f.mu.Lock()
			f.pipelines = append(f.pipelines, ids)
			f.mu.Unlock()
		},
	}
}

func fakeCall(ctx context.Context, id int64) *scriptCall {
	c := &scriptCall{ctx: ctx}
	c.args = append(c.argv[:0], id)
	return c
}

// waitPipeliner waits until pl has n calls queued (what is "queued") or n
// round trips under way ("running").
func waitPipeliner(t *testing.T, pl *pipeliner, what string, n int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d %s", n, what), func() error {
		pl.mu.Lock()
		got := len(pl.queue)
		if what == "running" {
			got = pl.running
		}
		pl.mu.Unlock()
		if got != n {
			return fmt.Errorf("%d %s", got, what)
		}
		return nil
	})
}

// TestPipelinerQueuesWhileBusy checks the pipeliner's rules: a call runs at once
// while a round trip is free; once all are busy calls queue and go out
// together, in order, skipping those whose callers gave up; and when
// everything has answered no round trip is counted as running.
func TestPipelinerQueuesWhileBusy(t *testing.T) {
	f := &fakeRounds{release: make(chan struct{})}
	pl := newFakePipeliner(f)
	ctx := context.Background()

	var wg sync.WaitGroup
	got := make([]int64, 3+redisRoundTrips)
	errs := make([]error, len(got))
	for i := range redisRoundTrips {
		wg.Go(func() {
			reply, err := pl.do(fakeCall(ctx, int64(100+i)))
			if err != nil || len(reply) != 1 || reply[0] != int64(100+i) {
				t.Errorf("lone call %d: %v %v", i, reply, err)
			}
		})
	}
	// Every round trip is taken, so the next calls queue.
	waitPipeliner(t, pl, "running", redisRoundTrips)

	gone, cancel := context.WithCancel(ctx)
	cancel()
	queued := []struct {
		ctx context.Context
		id  int64
	}{{ctx, 1}, {gone, 2}, {ctx, 3}}
	for i, q := range queued {
		wg.Go(func() {
			reply, err := pl.do(fakeCall(q.ctx, q.id))
			errs[i] = err
			if err == nil {
				got[i] = reply[0]
			}
		})
		waitPipeliner(t, pl, "queued", i+1)
	}
	close(f.release)
	wg.Wait()

	if got[0] != 1 || errs[0] != nil || got[2] != 3 || errs[2] != nil {
		t.Errorf("queued calls answered %v, errors %v; want 1 and 3 answered", got[:3], errs[:3])
	}
	if !errors.Is(errs[1], context.Canceled) {
		t.Errorf("the abandoned call returned %v, want its context's error", errs[1])
	}
	if len(f.pipelines) != 1 || fmt.Sprint(f.pipelines[0]) != "[1 3]" {
		t.Errorf("pipelines sent: %v, want one of [1 3] (the abandoned call skipped)", f.pipelines)
	}
	if pl.pipelined.Load() != 2 {
		t.Errorf("pipelined = %d, want 2", pl.pipelined.Load())
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.running != 0 || len(pl.queue) != 0 {
		t.Errorf("after every call answered: %d running, %d queued", pl.running, len(pl.queue))
	}
}

// TestPipelinerBoundsPipelines checks that a long queue goes out in
// pipelines of at most redisMaxPipeline calls, every call once.
func TestPipelinerBoundsPipelines(t *testing.T) {
	f := &fakeRounds{release: make(chan struct{})}
	pl := newFakePipeliner(f)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range redisRoundTrips {
		wg.Go(func() { _, _ = pl.do(fakeCall(ctx, int64(-1-i))) })
	}
	const queued = 2*redisMaxPipeline + 5
	waitPipeliner(t, pl, "running", redisRoundTrips)
	for i := range queued {
		wg.Go(func() {
			if reply, err := pl.do(fakeCall(ctx, int64(i))); err != nil || reply[0] != int64(i) {
				t.Errorf("call %d: %v %v", i, reply, err)
			}
		})
	}
	waitPipeliner(t, pl, "queued", queued)
	close(f.release)
	wg.Wait()
	seen := map[any]bool{}
	for _, sent := range f.pipelines {
		if len(sent) > redisMaxPipeline {
			t.Errorf("a pipeline of %d calls, want at most %d", len(sent), redisMaxPipeline)
		}
		for _, id := range sent {
			if seen[id] {
				t.Errorf("call %v sent twice", id)
			}
			seen[id] = true
		}
	}
	// A pipeline of one runs as a lone call, which the fake does not record.
	if len(seen) < queued-redisRoundTrips {
		t.Errorf("%d calls went out in pipelines, want nearly all %d", len(seen), queued)
	}
}

// TestPipelineScriptsNoScript checks that a pipeline sent after Redis lost
// its scripts (SCRIPT FLUSH, or a restart) still decides every call once,
// on a standalone server and on a Cluster, where the calls spread over
// masters that each lost the script.
func TestPipelineScriptsNoScript(t *testing.T) {
	for _, tt := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := tt.client(t)
			ctx := context.Background()
			r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.TokenBucket, Events: 10, Window: time.Minute}, Options{Zone: "pipe", Timeout: 5 * time.Second})
			if _, err := r.Take(ctx, "k0", 1); err != nil {
				t.Fatal(err)
			}
			flush := func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() }
			var err error
			if cc, ok := client.(*redis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, flush)
			} else {
				err = flush(ctx, client.(*redis.Client))
			}
			if err != nil {
				t.Fatal(err)
			}
			var calls []*scriptCall
			for i := range 30 {
				calls = append(calls, r.newCall(r.deadlines.bound(ctx, r.timeout), fmt.Sprintf("k%d", i%10), 1, 0, nil))
			}
			r.pipeline.runMany(calls)
			// k0 had one take before; every key gets three here.
			left := map[string]int64{"k0": 9}
			for i, c := range calls {
				key := fmt.Sprintf("k%d", i%10)
				if _, ok := left[key]; !ok {
					left[key] = 10
				}
				left[key]--
				d, err := r.decodeReply(c.reply)
				if c.err != nil || err != nil {
					t.Fatalf("call %d: %v %v", i, c.err, err)
				}
				if !d.Allowed || d.Remaining != left[key] {
					t.Errorf("call %d (%s): %+v, want allowed with %d remaining", i, key, d, left[key])
				}
			}
		})
	}
}

// TestPipelineOutlivesCancelledCaller checks that a pipeline whose latest
// deadline belongs to a caller that has gone (its request context was
// cancelled) still answers the others.
func TestPipelineOutlivesCancelledCaller(t *testing.T) {
	client := redistest.Start(t).Client(t)
	r := newTestRedis(t, client, limiter.Policy{Algorithm: limiter.FixedWindow, Events: 10, Window: time.Minute}, Options{Zone: "gone", Timeout: time.Second})
	gone, cancel := context.WithTimeout(context.Background(), time.Minute)
	cancel()
	calls := []*scriptCall{
		r.newCall(r.deadlines.bound(context.Background(), r.timeout), "a", 1, 0, nil),
		r.newCall(gone, "b", 1, 0, nil), // its deadline is the latest
	}
	r.pipeline.runMany(calls)
	if d, err := r.decodeReply(calls[0].reply); calls[0].err != nil || err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("the waiting caller's decision: %+v %v %v", d, calls[0].err, err)
	}
}

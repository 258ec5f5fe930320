package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// ServerClock is the clock the scripts of the Redis stores sharing one
// client decide by: the server's TIME, so that instances whose clocks
// differ still agree, or the instance's own, on a server that refuses TIME
// inside scripts (AWS ElastiCache Serverless does; so does a server with
// TIME renamed away, or an ACL user without +time), where every decision
// would otherwise fail and fall to the zone's fail mode. It finds out by
// itself, with no setting:
//   - Probe asks every master or shard when the stores' scripts load
//     (Store.Preload);
//   - a decision on Redis's clock that fails with an error reply asks the
//     server it went to (at most every reprobeAfter, within the
//     decision's own deadline), so a failover to a server that refuses
//     TIME costs that decision one more round trip, not a failure;
//   - on the instance's clock, every recheckEvery a decision asks again
//     in the background, as does a NOSCRIPT reply (a restarted or
//     replaced server), so every instance goes back to Redis's clock
//     soon after the server allows TIME again.
//
// Stores that share a client should share one (Options.ServerClock),
// so they agree and the server is probed once for all of them.
type ServerClock struct {
	client   redis.UniversalClient
	probe    *redis.Script
	instance atomic.Bool
	onChange func(instance bool)
	// recheckEvery is how often a store on the instance's clock asks
	// whether the server allows TIME again; tests shorten it.
	recheckEvery time.Duration
	// clock is the instance's clock the scripts are sent when the server
	// refuses TIME: the system's, or a test's set behind the server's, so
	// that instances on different clocks can be tried on one machine
	// (SetInstanceClock).
	clock atomic.Pointer[instanceClock]

	// turn is held by the one probe under way: a channel, so that a
	// decision waiting for another's probe gives up at its deadline.
	turn chan struct{}
	// probed is when the last probe ended (under turn), and failProbed
	// when the last one a failed decision asked for did: only those count
	// against reprobeAfter for failed decisions, since a probe just before
	// a failover says nothing of the server after it.
	probed, failProbed time.Time
	// nextCheck is when, in Unix ns, a decision on the instance's clock
	// next starts a background probe.
	nextCheck atomic.Int64
	// checking is set while a background probe runs.
	checking atomic.Bool
}

// reprobeAfter bounds how often failed decisions probe the server again: a
// server that fails every decision for some other reason (a wrong
// password, say) is not asked once per request.
const reprobeAfter = time.Second

// probeTimeout bounds a probe that no decision waits for, on every master
// or shard at once.
const probeTimeout = time.Second

// defaultRecheckEvery is ServerClock.recheckEvery: on the instance's
// clock, one probe in the background every 10 s, one EVAL, is nothing
// to the server and brings the instances back to Redis's clock within
// seconds of the server allowing TIME again.
const defaultRecheckEvery = 10 * time.Second

// NewServerClock returns the clock of the stores on client, starting on
// the server's TIME. onChange, when set, hears every switch, so the caller
// can log it; it runs under the probe's turn and must not block.
func NewServerClock(client redis.UniversalClient, onChange func(instance bool)) *ServerClock {
	return &ServerClock{
		client:       client,
		probe:        redis.NewScript(lua.TimeProbe()),
		onChange:     onChange,
		recheckEvery: defaultRecheckEvery,
		turn:         make(chan struct{}, 1),
	}
}

// instanceClock boxes the Clock of ServerClock.clock.
type instanceClock struct{ limiter.Clock }

// SetInstanceClock sets the clock the stores send the scripts while the
// server refuses TIME; nil is the system clock. Production leaves it: it
// lets a test put one instance's clock behind another's on one machine,
// as hosts whose clocks are apart would be.
func (c *ServerClock) SetInstanceClock(clock limiter.Clock) {
	if clock == nil {
		c.clock.Store(nil)
		return
	}
	c.clock.Store(&instanceClock{clock})
}

// Instance reports whether the stores send the instance's clock because
// the server refuses TIME in scripts.
func (c *ServerClock) Instance() bool { return c != nil && c.instance.Load() }

// take waits for the probe's turn until ctx is done; it reports whether
// it got it.
func (c *ServerClock) take(ctx context.Context) bool {
	select {
	case c.turn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *ServerClock) give() { <-c.turn }

// Probe asks every master of a Cluster, every shard of a Ring, or the one
// server, whether its scripts may call TIME, and uses the instance's clock
// if any refuses. An error leaves the clock as it was unless some server
// did refuse.
func (c *ServerClock) Probe(ctx context.Context) error {
	if !c.take(ctx) {
		return fmt.Errorf("asking whether scripts may call TIME: %w", ctx.Err())
	}
	defer c.give()
	return c.probeAll(ctx)
}

// probeStale is Probe unless a probe ended within reprobeAfter, so the
// stores of one client that load their scripts together probe once.
func (c *ServerClock) probeStale(ctx context.Context) error {
	if !c.take(ctx) {
		return fmt.Errorf("asking whether scripts may call TIME: %w", ctx.Err())
	}
	defer c.give()
	if !c.probed.IsZero() && time.Since(c.probed) < reprobeAfter {
		return nil
	}
	return c.probeAll(ctx)
}

// probeAll is Probe once it has the turn.
func (c *ServerClock) probeAll(ctx context.Context) error {
	defer func() { c.probed = time.Now() }()
	var refused atomic.Bool
	ask := func(ctx context.Context, s redis.Scripter) error {
		no, err := c.refuses(ctx, s)
		if no {
			refused.Store(true)
		}
		return err
	}
	var err error
	switch cl := c.client.(type) {
	case *redis.ClusterClient:
		err = cl.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return ask(ctx, m) })
	case *redis.Ring:
		err = cl.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error { return ask(ctx, s) })
	default:
		err = ask(ctx, c.client)
	}
	if refused.Load() || err == nil {
		c.set(refused.Load())
	}
	if err != nil {
		return fmt.Errorf("asking whether scripts may call TIME: %w", err)
	}
	return nil
}

// refuses runs the probe on one server: whether it refuses TIME in
// scripts.
func (c *ServerClock) refuses(ctx context.Context, s redis.Scripter) (bool, error) {
	n, err := c.probe.Run(ctx, s, nil).Int64()
	return err == nil && n == 0, err
}

// serverOf is the server that holds redisKey: its Cluster master or Ring
// shard, or the one server of any other client.
func (c *ServerClock) serverOf(ctx context.Context, redisKey string) (redis.Scripter, error) {
	switch cl := c.client.(type) {
	case *redis.ClusterClient:
		return cl.MasterForKey(ctx, redisKey)
	case *redis.Ring:
		return cl.GetShardClientForKey(redisKey)
	}
	return c.client, nil
}

// set switches the clock, telling onChange of a switch.
func (c *ServerClock) set(instance bool) {
	if c.instance.Swap(instance) != instance && c.onChange != nil {
		c.onChange(instance)
	}
}

// refusedTime reports whether a script call on redisKey made on the
// server's clock that failed with err should run again on the instance's:
// err is an error reply, and the server refuses TIME in scripts (a probe of
// the key's server says so, or one said so since the call was sent). Every
// script asks TIME before it touches a key (lua/prelude.lua), so on such a
// server the call failed before it wrote anything, and running it again
// counts nothing twice. The probe runs within ctx, the decision's own
// deadline, and asks only the server the call went to: a stalled shard or
// master elsewhere holds up nobody.
func (c *ServerClock) refusedTime(ctx context.Context, err error, redisKey string) bool {
	var reply redis.Error
	if c == nil || !errors.As(err, &reply) || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return false
	}
	if c.instance.Load() {
		return true
	}
	if !c.take(ctx) {
		return c.instance.Load()
	}
	defer c.give()
	if c.instance.Load() { // a probe while this one waited for its turn
		return true
	}
	if time.Since(c.failProbed) < reprobeAfter {
		return false
	}
	if s, err := c.serverOf(ctx, redisKey); err == nil {
		if no, _ := c.refuses(ctx, s); no {
			c.set(true)
		}
	}
	c.probed = time.Now()
	c.failProbed = c.probed
	return c.instance.Load()
}

// due starts a background probe when the stores are on the instance's
// clock and recheckEvery has passed since the last one began; now is the
// time in Unix ns.
func (c *ServerClock) due(now int64) {
	if next := c.nextCheck.Load(); now >= next && c.nextCheck.CompareAndSwap(next, now+int64(c.recheckEvery)) {
		c.recheck()
	}
}

// recheck probes in the background, unless a probe ran within
// reprobeAfter or one is under way: a server that lost its scripts may be
// another server, which may allow TIME where the last refused it, or the
// other way round.
func (c *ServerClock) recheck() {
	if c == nil || !c.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.checking.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		_ = c.probeStale(ctx)
	}()
}

// instanceNow is the clock argument of a script call on the instance's
// clock (see lua/prelude.lua), "i" and Unix µs; it also starts a
// background probe when one is due.
func (c *ServerClock) instanceNow() string {
	now := time.Now()
	if ic := c.clock.Load(); ic != nil {
		now = ic.Now()
	}
	c.due(now.UnixNano())
	return "i" + strconv.FormatInt(now.UnixMicro(), 10)
}

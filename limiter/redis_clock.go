package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// ServerClock is the clock the scripts of the Redis stores sharing one
// client decide by: the server's TIME, so that instances whose clocks
// differ still agree, or the instance's own, on a server that refuses TIME
// inside scripts (AWS ElastiCache Serverless does; so does a server with
// TIME renamed away), where every decision would otherwise fail and fall
// to the zone's fail mode. It finds out by itself, with no setting: Probe
// runs when the stores' scripts load (Redis.Preload), and a decision that
// fails with an error reply probes again (at most every reprobeAfter), so
// a failover to a server that refuses TIME costs that decision one more
// round trip, not a failure; a NOSCRIPT reply, which a restarted or
// replaced server gives, probes again in the background. Stores that share
// a client should share one (RedisOptions.ServerClock), so they agree and
// the server is probed once for all of them.
type ServerClock struct {
	client   redis.UniversalClient
	probe    *redis.Script
	instance atomic.Bool
	onChange func(instance bool)

	mu     sync.Mutex // one probe at a time
	probed time.Time  // when the last probe ended; under mu
	// failProbed is when the last probe that a failed decision asked for
	// ended, under mu: only those count against reprobeAfter for failed
	// decisions, since a probe just before a failover says nothing of
	// the server after it.
	failProbed time.Time
	// checking is set while a background probe runs.
	checking atomic.Bool
}

// reprobeAfter bounds how often failed decisions probe the server again: a
// server that fails every decision for some other reason (a wrong
// password, say) is not asked once per request.
const reprobeAfter = time.Second

// probeTimeout bounds one probe, on every master or shard at once.
const probeTimeout = time.Second

// NewServerClock returns the clock of the stores on client, starting on
// the server's TIME. onChange, when set, hears every switch, so the caller
// can log it; it runs under the probe's lock and must not block.
func NewServerClock(client redis.UniversalClient, onChange func(instance bool)) *ServerClock {
	return &ServerClock{client: client, probe: redis.NewScript(lua.TimeProbe()), onChange: onChange}
}

// Instance reports whether the stores send the instance's clock because
// the server refuses TIME in scripts.
func (c *ServerClock) Instance() bool { return c != nil && c.instance.Load() }

// Probe asks every master of a Cluster, every shard of a Ring, or the one
// server, whether its scripts may call TIME, and uses the instance's clock
// if any refuses. An error leaves the clock as it was unless some server
// did refuse.
func (c *ServerClock) Probe(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.probeLocked(ctx)
}

func (c *ServerClock) probeLocked(ctx context.Context) error {
	defer func() { c.probed = time.Now() }()
	var refused atomic.Bool
	ask := func(ctx context.Context, s redis.Scripter) error {
		n, err := c.probe.Run(ctx, s, nil).Int64()
		if err != nil {
			return err
		}
		if n == 0 {
			refused.Store(true)
		}
		return nil
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

// set switches the clock, telling onChange of a switch.
func (c *ServerClock) set(instance bool) {
	if c.instance.Swap(instance) != instance && c.onChange != nil {
		c.onChange(instance)
	}
}

// refusedTime reports whether a script call made on the server's clock
// that failed with err should run again on the instance's: err is an
// error reply, and the server refuses TIME in scripts (a probe says so, or
// said so since the call was sent). Every script asks TIME before it
// touches a key (lua/prelude.lua), so on such a server the call failed
// before it wrote anything, and running it again counts nothing twice.
func (c *ServerClock) refusedTime(ctx context.Context, err error) bool {
	var reply redis.Error
	if c == nil || !errors.As(err, &reply) || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return false
	}
	if c.instance.Load() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.instance.Load() { // a probe while this one waited for mu
		return true
	}
	if time.Since(c.failProbed) >= reprobeAfter {
		// The call's own deadline may have passed; the server answered
		// at once, so asking it again is quick.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
		_ = c.probeLocked(pctx)
		cancel()
		c.failProbed = c.probed
	}
	return c.instance.Load()
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
		c.mu.Lock()
		defer c.mu.Unlock()
		if time.Since(c.probed) < reprobeAfter {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		_ = c.probeLocked(ctx)
	}()
}

// instanceNow is the clock argument of a script call on the instance's
// clock (see lua/prelude.lua): "i" and Unix µs.
func instanceNow() string {
	return "i" + strconv.FormatInt(time.Now().UnixMicro(), 10)
}

// probeStale is Probe unless a probe ended within reprobeAfter, so the
// stores of one client that load their scripts together probe once.
func (c *ServerClock) probeStale(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.probed.IsZero() && time.Since(c.probed) < reprobeAfter {
		return nil
	}
	return c.probeLocked(ctx)
}

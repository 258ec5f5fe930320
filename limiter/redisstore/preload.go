package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Preload connects to the store's Redis and loads its scripts there (on
// every master of a Cluster, every shard): the one that decides and the batch script
// that gives leases back and renews them (see ReturnMany), so that the first decision is an ordinary
// one: without it, the first decision after a start or a reload pays a
// dial and a NOSCRIPT round trip, which can run past a tight timeout and
// leave the decision to the zone's fail mode. ctx bounds the whole load.
// An error leaves the store as usable as before: decisions dial and load
// the script themselves, as they would have anyway.
//
// It first asks whether the server lets scripts call TIME (ServerClock),
// unless the stores sharing the client asked within the last second. A
// server that does not answer (a shard or a master down) fails the probe
// but keeps no other server from getting the scripts.
func (r *Store) Preload(ctx context.Context) error {
	probeErr := r.serverClock.probeStale(ctx)
	if err := r.load(ctx); err != nil {
		return err
	}
	if probeErr != nil {
		return fmt.Errorf("redis store for zone %q: %w", r.zone, probeErr)
	}
	return nil
}

// load is Preload's loading of the scripts.
func (r *Store) load(ctx context.Context) error {
	return r.loadScripts(ctx, r.script, r.batchScript)
}

// loadScripts loads scripts on every server of the store's client.
func (r *Store) loadScripts(ctx context.Context, scripts ...*redis.Script) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, s := range scripts {
			if err := s.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("redis store for zone %q: loading its scripts: %w", r.zone, err)
			}
		}
		return nil
	}
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	if ring, ok := r.client.(*redis.Ring); ok {
		// Every shard, whatever the others do: no shard ever counts as
		// down (see shards.go).
		return ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := load(ctx, c); err != nil {
				return fmt.Errorf("shard %s: %w", c.Options().Addr, err)
			}
			return nil
		})
	}
	return load(ctx, r.client)
}

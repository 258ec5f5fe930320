package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Shards spread keys over standalone servers without Cluster: a go-redis
// Ring whose membership never changes. Each Redis key goes to the shard
// its hash tag (the client key's digest, see Store.Key) picks by
// rendezvous hashing over the shards' addresses, so every state key of one
// client key, in every zone, is on one shard, and every instance that
// lists the same shards, in whatever order, picks the same one.
//
// go-redis's Ring by default takes a shard its heartbeat finds down out of
// the hashing, which moves that shard's keys onto the others while it is
// down and back when it returns: each move starts the keys afresh on
// another server, and instances that see the outage at different moments
// count one key in two places. Floodgate's Ring never does: a shard that
// fails fails its own keys' decisions, to which the zone's fail mode
// applies, while the other shards' keys go on as before; each shard has its
// own breaker (Breaker.shard) and its own pipelines in every store
// (Store.shards), so a shard that stalls holds up only its own keys. When
// it returns, its keys start afresh if it lost its data.

// ringHeartbeatEvery is how often the Ring's heartbeat runs. It can
// change nothing (ringAlwaysUp), so it only needs to run rarely.
const ringHeartbeatEvery = time.Hour

// checkShards refuses a shard list the Ring could not name its shards by:
// an empty address, or one listed twice.
func checkShards(shards []string) error {
	seen := make(map[string]bool, len(shards))
	for _, a := range shards {
		switch {
		case a == "":
			return errors.New("shards holds an empty address")
		case seen[a]:
			return fmt.Errorf("shards lists %s twice", a)
		}
		seen[a] = true
	}
	return nil
}

// newRing is the client for opts, whose Addrs are the shards: a Ring of
// standalone clients with opts' settings each, named by their addresses,
// hashed by shardHash and never taken out of the hashing.
func newRing(opts *redis.UniversalOptions) *redis.Ring {
	addrs := make(map[string]string, len(opts.Addrs))
	for _, a := range opts.Addrs {
		addrs[a] = a
	}
	return redis.NewRing(&redis.RingOptions{
		Addrs:                   addrs,
		ClientName:              opts.ClientName,
		HeartbeatFrequency:      ringHeartbeatEvery,
		HeartbeatFn:             ringAlwaysUp,
		NewConsistentHash:       newShardHash,
		Protocol:                opts.Protocol,
		DisableIdentity:         opts.DisableIdentity,
		Username:                opts.Username,
		Password:                opts.Password,
		DB:                      opts.DB,
		MaxRetries:              opts.MaxRetries,
		DialTimeout:             opts.DialTimeout,
		DialerRetries:           opts.DialerRetries,
		ReadTimeout:             opts.ReadTimeout,
		WriteTimeout:            opts.WriteTimeout,
		ContextTimeoutEnabled:   opts.ContextTimeoutEnabled,
		PoolFIFO:                opts.PoolFIFO,
		PoolSize:                opts.PoolSize,
		PoolTimeout:             opts.PoolTimeout,
		MinIdleConns:            opts.MinIdleConns,
		MaxIdleConns:            opts.MaxIdleConns,
		MaxActiveConns:          opts.MaxActiveConns,
		ConnMaxIdleTime:         opts.ConnMaxIdleTime,
		ConnMaxLifetime:         opts.ConnMaxLifetime,
		PipelineReadBufferSize:  opts.PipelineReadBufferSize,
		PipelineWriteBufferSize: opts.PipelineWriteBufferSize,
		TLSConfig:               opts.TLSConfig,
	})
}

// ringAlwaysUp is the Ring's heartbeat check: every shard counts as up, so
// none leaves the hashing and no key moves (see above).
func ringAlwaysUp(context.Context, *redis.Client) bool { return true }

// shardHash is rendezvous (highest random weight) hashing: a key goes to
// the shard whose name scores highest with it. Floodgate's own, not
// go-redis's default, so that instances built with different go-redis
// versions still agree on every key's shard.
type shardHash struct {
	names  []string
	hashes []uint64 // of names, in the same order
}

func newShardHash(names []string) redis.ConsistentHash {
	h := &shardHash{names: names, hashes: make([]uint64, len(names))}
	for i, n := range names {
		h.hashes[i] = fnv64(n)
	}
	return h
}

// Get returns the shard for key (the Redis key's hash tag), or "" when
// there is none.
func (h *shardHash) Get(key string) string {
	k := fnv64(key)
	best, bestScore := -1, uint64(0)
	for i, n := range h.hashes {
		s := mix64(k ^ n)
		// Ties, vanishingly rare, go to the smaller name, so the order the
		// shards were listed in never matters.
		if best < 0 || s > bestScore || (s == bestScore && h.names[i] < h.names[best]) {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return ""
	}
	return h.names[best]
}

// fnv64 is the 64-bit FNV-1a hash of s.
func fnv64(s string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(s)) // never fails
	return f.Sum64()
}

// mix64 is splitmix64's finalizer: a bijection that spreads every input
// bit over the output, so the scores of one key on different shards are
// independent.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ringShards sets up the per-shard parts of a store on a Ring: the
// shard of each Redis key, and a pipeline per shard.
func (r *Store) ringShards(ring *redis.Ring) {
	r.shardOf = func(redisKey string) string {
		c, err := ring.GetShardClientForKey(redisKey)
		if err != nil {
			return ""
		}
		return c.Options().Addr
	}
	r.shards = make(map[string]*pipeliner, len(ring.Options().Addrs))
	r.lanes = make(map[string]int, len(ring.Options().Addrs))
	for _, addr := range ring.Options().Addrs {
		p := &pipeliner{runOne: r.pipeline.runOne, runMany: r.pipeline.runMany}
		r.shards[addr] = p
		r.lanes[addr] = len(r.lanes)
	}
}

// routeOf is the breaker of the server redisKey is on and the pipeline a
// call on it goes by: its shard's on a Ring, else the client's breaker
// and the store's one pipeline.
func (r *Store) routeOf(redisKey string) (*Breaker, *pipeliner) {
	if r.shardOf == nil {
		return r.breaker, &r.pipeline
	}
	shard := r.shardOf(redisKey)
	p := r.shards[shard]
	if p == nil {
		p = &r.pipeline
	}
	return r.breaker.shard(shard), p
}

// breakerFor is routeOf's breaker alone.
func (r *Store) breakerFor(redisKey string) *Breaker {
	b, _ := r.routeOf(redisKey)
	return b
}

// byShard splits items by the shard of their Redis key (key gives it), for
// the batch script, whose keys must all be on the server it runs on: one
// group per shard on a Ring, else all of them together.
func byShard[T any](r *Store, items []T, key func(T) string) [][]T {
	if r.shardOf == nil || len(items) == 0 {
		return [][]T{items}
	}
	index := make(map[string]int)
	var groups [][]T
	for _, it := range items {
		s := r.shardOf(key(it))
		i, ok := index[s]
		if !ok {
			i = len(groups)
			index[s] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], it)
	}
	return groups
}

// eachGroup runs f on every group at once and waits for them all, so a
// shard that stalls delays no other shard's share.
func eachGroup[T any](groups [][]T, f func([]T)) {
	if len(groups) == 1 {
		f(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { f(g) })
	}
	wg.Wait()
}

// pipelinedCalls is how many of the store's calls went out in pipelines of
// two or more, over all its pipelines.
func (r *Store) pipelinedCalls() int64 {
	n := r.pipeline.pipelined.Load()
	for _, p := range r.shards {
		n += p.pipelined.Load()
	}
	return n
}

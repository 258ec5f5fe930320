// Package redisstore is the Redis store: a limiter.Store (and Leaser and
// Charger) that keeps every key's state in Redis, so all instances sharing
// a Redis (standalone, Cluster, Sentinel or shards) enforce one limit
// together. Each decision is one Lua script run (the scripts are in the
// module's lua/ directory), timed by the server's clock. Beside the store
// are its client (Config), the breaker that stops asking a failing Redis,
// per-decision deadlines, shards, concurrency slots, the server clock and
// runtime overrides kept in Redis (Overrides).
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every key a Redis store writes when
// Options.Prefix is empty, so Floodgate's keys can be told apart from
// an application's in a shared database.
const DefaultPrefix = "floodgate:"

// DefaultTimeout bounds one Redis decision when Options.Timeout is
// zero: long enough for a round trip on a local network, short enough that a
// stalled Redis costs a request little before the zone's fail mode applies.
const DefaultTimeout = 5 * time.Millisecond

// ErrTimeout is wrapped by every error a store returns because its
// per-decision timeout (or the caller's deadline) passed before the store
// answered, so callers can count timeouts apart from other failures with
// errors.Is. Any error from Take or Refund means no decision was made.
var ErrTimeout = errors.New("store did not answer in time")

// Options configures a Redis store.
type Options struct {
	// Prefix starts every key; empty means DefaultPrefix.
	Prefix string
	// Zone and Tier name the limit whose state the store keeps (Tier empty
	// for the zone's own), so limits sharing a Redis never share keys; see
	// StateID.
	Zone string
	Tier string
	// Override keeps the state of one of the zone's override limits
	// (OverrideStateID) instead of its own or a tier's; Tier is then
	// ignored.
	Override bool
	// Timeout bounds each decision; zero means DefaultTimeout. A
	// decision may run up to an eighth of it longer: deadlines are rounded
	// up so that decisions share timers (see deadlines).
	Timeout time.Duration
	// Breaker is shared by the stores on one client; nil gives the store
	// one of its own.
	Breaker *Breaker
	// ServerClock is shared by the stores on one client, like Breaker;
	// nil gives the store one of its own.
	ServerClock *ServerClock

	// Keys names client keys in Redis key names; nil is SHA-256. Every
	// instance sharing the state must name keys alike (one key_secret).
	Keys *limiter.KeyHasher

	// OnRenewError, when set, hears of a failed renewal of the
	// concurrency slots the store holds (see slots.go), so the
	// caller can log it: two in a row and a slot lapses under its request.
	OnRenewError func(error)

	// Clock, when set, replaces the Redis server's TIME, so tests can step
	// time exactly as they do the memory store's. Leave it nil in
	// production: instances sharing a Redis must share its clock. With a
	// Clock the scripts keep every key 10 minutes longer than its state
	// needs, since a test may step far ahead of the wall clock or stay put
	// while real time passes, and state must not vanish under it.
	Clock limiter.Clock
}

// Store keeps the state of every key in Redis, so all instances that share a
// Redis (standalone, Cluster or Sentinel) enforce one limit together. Each
// decision is one script run, atomic in Redis and timed by the server's
// clock, so instances with skewed clocks still agree; on a server that
// refuses TIME in scripts, by the instance's (see ServerClock).
type Store struct {
	client redis.UniversalClient
	policy limiter.Policy
	p      limiter.Compiled
	// alg is the policy's algorithm in this package's table, traits its
	// limiter.Traits.
	alg    *algorithm
	traits limiter.Traits
	cost   int64 // the largest cost a request may have
	script *redis.Script
	src    string // the script's source, sent when Redis lacks it
	// batchScript runs several decisions in one call (see lua.Batch).
	batchScript *redis.Script
	batchSrc    string
	args        []any // the policy's script arguments
	// pipeline lets concurrent decisions share round trips.
	pipeline pipeliner
	// shards, on a Ring (the redis block's shards), are a pipeline per
	// shard by address, and shardOf names the shard of a Redis key, so a
	// shard that fails or stalls holds up only its own keys (see
	// shards.go). Both are nil on any other client.
	shards  map[string]*pipeliner
	shardOf func(redisKey string) string
	// lanes numbers the shards by address, for LeaseLane.
	lanes map[string]int
	// breaker answers at once while Redis keeps failing.
	breaker *Breaker
	// reloadHashSlots, for a Cluster client, asks it to read the hash
	// slot map again (in the background, at most every 200ms): go-redis
	// otherwise rereads it only on MOVED or READONLY replies or once a
	// minute, so after a master dies its hash slots would go on failing
	// for up to a minute after a replica has taken them over.
	reloadHashSlots func()
	zone            string
	keyHead         string // prefix, zone and the opening of the hash tag
	keyTail         string // the closing of the hash tag and the policy (policyTag)
	timeout         time.Duration
	// deadlines bound each decision by timeout without a timer each.
	deadlines *deadlines
	clock     limiter.Clock
	// serverClock says whether the scripts read Redis's TIME or are sent
	// the instance's clock.
	serverClock *ServerClock

	slotID  string // this store's random part of every slot id
	slotSeq atomic.Uint64
	// slots are the concurrency slots this store holds, which it renews
	// while their requests run; onRenewError hears of a renewal that
	// failed.
	slots        slotTable
	onRenewError func(error)
	// keys names client keys (Options.Keys).
	keys *limiter.KeyHasher
}

// Exactness bounds of the Redis scripts. Lua numbers are doubles, exact for
// integers up to 2^53; each check below keeps every product a script forms
// beneath that, with room for a cost of up to the quota on top.
const (
	redisExact     = 1 << 53
	redisMaxWindow = 1 << 45 // µs, about 407 days: absolute times stay exact
)

// New returns a store enforcing p with the state in Redis.
//
// The scripts decide exactly, like the memory store, over this range of
// policies, and New refuses any other:
//   - every algorithm: Window at most 2^45 µs (about 407 days);
//   - token_bucket and leaky_bucket: 4×(B×W' + max_delay×L' + L') <= 2^53,
//     where L' and W' (in µs) are Events and Window divided by their
//     greatest common divisor; for 100/1h that is B×36s, far inside;
//   - sliding_window_counter: 4×L×W <= 2^53 with W in µs, so up to about
//     625,000 per hour or 26,000 per day.
//
// The client must honour context deadlines (ContextTimeoutEnabled, as
// Config.NewClient sets it), or a stalled Redis would hold requests
// for the client's socket timeout instead of Timeout.
func New(client redis.UniversalClient, p limiter.Policy, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("redis store for zone %q: no client", opts.Zone)
	}
	if err := checkContextTimeouts(client); err != nil {
		return nil, fmt.Errorf("redis store for zone %q: %w", opts.Zone, err)
	}
	params, err := p.Compile()
	if err != nil {
		return nil, fmt.Errorf("redis store for zone %q: %w", opts.Zone, err)
	}
	alg := lookupAlgorithm(p.Algorithm)
	if err := checkRedisExact(alg, &params); err != nil {
		return nil, fmt.Errorf("redis store for zone %q: policy %s: %w", opts.Zone, p, err)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redis store for zone %q: negative timeout %v", opts.Zone, opts.Timeout)
	}
	r := &Store{
		client:  client,
		policy:  p,
		p:       params,
		alg:     alg,
		traits:  p.Algorithm.Traits(),
		cost:    p.MaxCost(),
		zone:    opts.Zone,
		timeout: opts.Timeout,
		clock:   opts.Clock,

		keys:         opts.Keys,
		onRenewError: opts.OnRenewError,
	}
	if r.timeout == 0 {
		r.timeout = DefaultTimeout
	}
	r.deadlines = newDeadlines(r.timeout)
	if cc, ok := client.(*redis.ClusterClient); ok {
		r.reloadHashSlots = func() { cc.ReloadState(context.Background()) }
	}
	r.breaker = opts.Breaker
	if r.breaker == nil {
		r.breaker = NewBreaker()
	}
	r.serverClock = opts.ServerClock
	if r.serverClock == nil {
		r.serverClock = NewServerClock(client, nil)
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	state := limiter.StateID(opts.Zone, opts.Tier)
	if opts.Override {
		state = limiter.OverrideStateID(opts.Zone)
	}
	if alg.holdsSlots {
		// A concurrency key's state is its requests in flight, whatever
		// limit counts them: the zone's, a tier's, an override's, or a
		// reload's new one all read and write one set per key, so a
		// limit that changes while requests run still counts them.
		state = limiter.StateID(opts.Zone, "")
	}
	r.keyHead = limiter.EscapeKeyPart(prefix) + state + ":{"

	r.args = alg.redisArgs(&params)
	scripts := alg.scripts
	if params.Windows != nil {
		// L alone: the windows are sent with each call (callOn).
		r.args, scripts = []any{params.L}, alg.calendarScripts
	}
	if alg.holdsSlots {
		var id [8]byte
		_, _ = rand.Read(id[:]) // never fails: crypto/rand aborts the program instead
		r.slotID = hex.EncodeToString(id[:]) + "."
	}
	r.keyTail = "}:" + policyTag(alg, &params)
	if alg.holdsSlots {
		// No limit in the name: every limit of the zone shares it (above).
		r.keyTail = "}:" + alg.keySuffix + ":shared"
	}
	src := scripts.one
	r.script, r.src = redis.NewScript(src), src
	r.batchScript, r.batchSrc = redis.NewScript(scripts.batch), scripts.batch
	r.pipeline.runOne = func(c *scriptCall) {
		keys := []string{c.key}
		cmd := r.script.EvalSha(c.ctx, r.client, keys, c.args...)
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			r.serverClock.recheck()
			cmd = r.script.Eval(c.ctx, r.client, keys, c.args...)
		}
		c.reply, c.err = cmd.Int64Slice()
	}
	r.pipeline.runMany = func(calls []*scriptCall) {
		if pipelineScripts(r.client, r.script, r.src, calls) {
			r.serverClock.recheck()
		}
	}
	if ring, ok := client.(*redis.Ring); ok {
		r.ringShards(ring)
	}
	return r, nil
}

// checkRedisExact refuses policies whose arithmetic would leave the range
// in which Lua's doubles are exact integers.
func checkRedisExact(alg *algorithm, p *limiter.Compiled) error {
	if p.W > redisMaxWindow {
		return fmt.Errorf("window %v is longer than the Redis store supports (%v)", microseconds(p.W), microseconds(redisMaxWindow))
	}
	if alg.checkExact != nil {
		return alg.checkExact(p)
	}
	return nil
}

// checkContextTimeouts refuses a client that would ignore the per-decision
// deadline. Clients of other types are trusted.
func checkContextTimeouts(client redis.UniversalClient) error {
	var enabled bool
	switch c := client.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		enabled = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !enabled {
		return errors.New("the Redis client ignores context deadlines, so the per-decision timeout could not be honoured: set ContextTimeoutEnabled")
	}
	return nil
}

// Policy is the limit this store enforces.
func (r *Store) Policy() limiter.Policy { return r.policy }

// Key is the Redis key that holds the state of a client key: its name by
// Options.Keys (16 bytes of its SHA-256, or of its HMAC under a
// secret) in hex, inside a hash tag, so no raw client key (an API key, a
// token) reaches Redis and every instance computes the same name.
func (r *Store) Key(key string) string {
	sum := r.keys.Sum(key)
	var b strings.Builder
	b.Grow(len(r.keyHead) + 32 + len(r.keyTail))
	b.WriteString(r.keyHead)
	var h [32]byte
	hex.Encode(h[:], sum[:16])
	b.Write(h[:])
	b.WriteString(r.keyTail)
	return b.String()
}

// Take implements Store with one script run in Redis.
func (r *Store) Take(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	if err := r.checkCost(cost); err != nil {
		return limiter.Admission{}, err
	}
	var seq uint64
	var slot string
	if r.alg.holdsSlots {
		seq = r.slotSeq.Add(1)
		slot = r.slotName(seq)
	}
	redisKey := r.Key(key)
	a, err := r.runKey(ctx, redisKey, cost, 0, slot)
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("redis store for zone %q: take: %w", r.zone, err)
	}
	if a.Allowed {
		a = holding(a, r, key, cost)
		a.Receipt.Slot = seq
		if r.traits.Leases {
			a.Receipt.Granted = cost
		}
		if slot != "" {
			r.hold(slot, redisKey, cost)
		}
	}
	return a, nil
}

// TakeUpTo implements Leaser with one script run, for the algorithms whose
// Traits say Leases.
func (r *Store) TakeUpTo(ctx context.Context, key string, cost, want int64) (limiter.Admission, error) {
	if err := r.checkLease(cost, want); err != nil {
		return limiter.Admission{}, err
	}
	a, err := r.run(ctx, key, cost, 0, want)
	if err != nil {
		return limiter.Admission{}, fmt.Errorf("redis store for zone %q: lease: %w", r.zone, err)
	}
	a = holding(a, r, key, a.Receipt.Granted)
	return a, nil
}

// Charge implements Charger with one script run, for the algorithms whose
// Traits say Charges: the script's cost argument is "c" and the count (see
// lua/prelude.lua), and Redis TIME is the clock, as for a take.
func (r *Store) Charge(ctx context.Context, key string, cost int64) (limiter.Admission, error) {
	if !r.traits.Charges {
		return limiter.Admission{}, fmt.Errorf("redis store for zone %q: %s cannot charge past its limit", r.zone, r.policy.Algorithm)
	}
	if err := r.checkCost(cost); err != nil {
		return limiter.Admission{}, err
	}
	ctx = r.deadlines.bound(ctx, r.timeout)
	call := r.callOn(ctx, r.Key(key), cost, 0, nil)
	call.args[0] = "c" + strconv.FormatInt(cost, 10)
	reply, err := r.runCall(call)
	if err == nil {
		var a limiter.Admission
		if a, err = r.decodeReply(reply); err == nil {
			return a, nil
		}
	}
	return limiter.Admission{}, fmt.Errorf("redis store for zone %q: charge: %w", r.zone, err)
}

// checkLease refuses a lease the policy cannot grant.
func (r *Store) checkLease(cost, want int64) error {
	if !r.traits.Leases {
		return fmt.Errorf("redis store for zone %q: %s does not lease", r.zone, r.policy.Algorithm)
	}
	if cost < 1 || cost > r.cost || want < cost {
		return fmt.Errorf("redis store for zone %q: lease of %d for a cost of %d outside 1..%d", r.zone, want, cost, r.cost)
	}
	return nil
}

// Peek implements Store with one script run that gives back nothing.
func (r *Store) Peek(ctx context.Context, key string) (limiter.Decision, error) {
	a, err := r.run(ctx, key, 0, 0, r.refundArg(limiter.Receipt{}))
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redis store for zone %q: peek: %w", r.zone, err)
	}
	return a.Decision, nil
}

// Reset implements Store: it deletes the key's state, under the store's
// timeout; DEL's count says whether there was any.
func (r *Store) Reset(ctx context.Context, key string) (bool, error) {
	ctx = r.deadlines.bound(ctx, r.timeout)
	n, err := r.client.Del(ctx, r.Key(key)).Result()
	if err != nil {
		return false, fmt.Errorf("redis store for zone %q: reset: %w", r.zone, err)
	}
	return n > 0, nil
}

// GiveBack implements Store: it gives back units of what taken consumed,
// or releases its concurrency slot, in one script run. The script gives
// them back only to the state that took them, which taken.Epoch names
// (see lua/prelude.lua): after a reset they are dropped.
func (r *Store) GiveBack(ctx context.Context, key string, units int64, taken limiter.Receipt) (limiter.Decision, error) {
	if err := r.checkCost(units); err != nil {
		return limiter.Decision{}, err
	}
	if taken.Slot != 0 {
		r.release(r.slotName(taken.Slot))
	}
	a, err := r.run(ctx, key, -units, taken.Epoch, r.refundArg(taken))
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redis store for zone %q: give-back: %w", r.zone, err)
	}
	return a.Decision, nil
}

// checkCost refuses a cost no request of the policy can have.
func (r *Store) checkCost(cost int64) error {
	if cost < 1 || cost > r.cost {
		return fmt.Errorf("redis store for zone %q: cost %d outside 1..%d", r.zone, cost, r.cost)
	}
	return nil
}

// refundArg is the argument a refund of taken passes after the policy's,
// naming the admission it gives back; nil for the algorithms that need
// none.
func (r *Store) refundArg(taken limiter.Receipt) any {
	if r.alg.refundArg == nil {
		return nil
	}
	return r.alg.refundArg(r, taken)
}

// slotName is the id of this store's concurrency slot number seq
// (limiter.Receipt.Slot): the store's random part and the number in base
// 36; "" for 0, no slot.
func (r *Store) slotName(seq uint64) string {
	if seq == 0 {
		return ""
	}
	return r.slotID + strconv.FormatUint(seq, 36)
}

// run calls the script for key under the store's timeout, in a round trip
// shared with concurrent decisions when there are any (see pipeliner), and
// reads its reply; while Redis keeps failing it answers ErrUnavailable
// at once instead (see Breaker). A positive cost takes, a negative one
// gives back, to the state epoch names (see callOn).
func (r *Store) run(ctx context.Context, key string, cost int64, epoch uint64, extra any) (limiter.Admission, error) {
	return r.runKey(ctx, r.Key(key), cost, epoch, extra)
}

// runKey is run for a client key already named in Redis (Key).
func (r *Store) runKey(ctx context.Context, redisKey string, cost int64, epoch uint64, extra any) (limiter.Admission, error) {
	// A Done that closes at the deadline, not only socket deadlines:
	// go-redis dials a new connection in the background and only Done stops
	// the wait for it, so an unreachable host would otherwise hold the
	// request for the client's dial timeout.
	ctx = r.deadlines.bound(ctx, r.timeout)
	reply, err := r.runCall(r.callOn(ctx, redisKey, cost, epoch, extra))
	if err != nil {
		return limiter.Admission{}, err
	}
	return r.decodeReply(reply)
}

// runCall runs one script call, whose ctx the caller has bounded (calls
// off the request path, ReturnMany's on a Cluster or a renewal of
// concurrency slots, wait longer than a decision), in a round trip shared
// with concurrent ones; while Redis keeps failing it answers
// ErrUnavailable at once.
func (r *Store) runCall(c *scriptCall) ([]int64, error) {
	b, p := r.routeOf(c.key)
	if b.open() {
		return nil, ErrUnavailable
	}
	reply, err := p.do(c)
	if err != nil && r.onInstanceClock(c.ctx, err, c) {
		c.reply, c.err, c.done = nil, nil, nil
		reply, err = p.do(c)
	}
	return reply, r.outcome(b, err)
}

// onInstanceClock reports whether calls, sent on the server's clock and
// failed with err, are to run again because the server refuses TIME in
// scripts (see ServerClock.refusedTime), and if so puts the instance's
// clock in their arguments.
func (r *Store) onInstanceClock(ctx context.Context, err error, calls ...*scriptCall) bool {
	if calls[0].args[1] != "" || !r.serverClock.refusedTime(ctx, err, calls[0].key) {
		return false
	}
	now := r.serverClock.instanceNow()
	for _, c := range calls {
		c.args[1] = now
	}
	return true
}

// InstanceClock reports whether the store's scripts run on the instance's
// clock because its server refuses TIME in scripts (see ServerClock).
func (r *Store) InstanceClock() bool { return r.serverClock.Instance() }

// outcome tells the breaker b (of the server the call went to) how a call
// to Redis went and, when it failed, asks a Cluster client for the hash
// slot map again if the failure may mean it moved, and marks a timeout as
// ErrTimeout.
func (r *Store) outcome(b *Breaker, err error) error {
	b.record(err)
	if err == nil {
		return nil
	}
	if r.reloadHashSlots != nil && storeWide(err) && !errors.Is(err, context.Canceled) {
		r.reloadHashSlots()
	}
	if isTimeout(err) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return r.nameDeniedCommand(err)
}

// newCall is the script call deciding for key: its Redis key and
// arguments {cost, now, the policy's, the epoch, extra} (see callOn).
func (r *Store) newCall(ctx context.Context, key string, cost int64, epoch uint64, extra any) *scriptCall {
	return r.callOn(ctx, r.Key(key), cost, epoch, extra)
}

// callOn is newCall for a client key already named in Redis (Key), for a
// caller that sends several calls on one key. A calendar policy's call
// also carries the starts of the windows around the instance's clock,
// which the script picks the one of that holds Redis's TIME.
//
// Every algorithm but concurrency is sent an epoch (lua/prelude.lua):
// a take (cost > 0, or a charge) a new random one, which the state takes
// if the call makes it; a give-back (cost < 0) epoch, that of the state
// which took the units (Receipt.Epoch, 0 naming none); a look 0.
func (r *Store) callOn(ctx context.Context, redisKey string, cost int64, epoch uint64, extra any) *scriptCall {
	var now any = "" // Redis's TIME (lua/prelude.lua)
	var here int64
	switch {
	case r.clock != nil:
		here = r.clock.Now().UnixMicro()
		now = here
	case r.serverClock.Instance():
		now = r.serverClock.instanceNow()
	}
	c := &scriptCall{ctx: ctx, key: redisKey}
	c.args = append(c.argv[:0], cost, now)
	c.args = append(c.args, r.args...)
	if r.p.Windows != nil {
		if here == 0 {
			here = time.Now().UnixMicro()
		}
		c.args = append(c.args, r.p.Windows.Around(here).Args[:]...)
	}
	if r.alg.epochs() {
		if cost > 0 {
			epoch = newEpoch()
		}
		c.args = append(c.args, int64(epoch))
	}
	if extra != nil {
		c.args = append(c.args, extra)
	}
	return c
}

// newEpoch is a state's epoch for a take to send (see lua/prelude.lua):
// random, nonzero and below 2^53, which the scripts' numbers hold exactly.
// Two states of a key draw the same one once in 2^52 resets.
func newEpoch() uint64 {
	return mrand.Uint64()>>11 | 1
}

// decodeReply reads a script's reply as decodeReplyOf does, after taking
// off the state's epoch, which ends the reply of every algorithm that has
// one (see lua/prelude.lua), into the receipt.
func (r *Store) decodeReply(reply []int64) (limiter.Admission, error) {
	if !r.alg.epochs() {
		return decodeReplyOf(reply)
	}
	if len(reply) == 0 {
		return limiter.Admission{}, errors.New("script replied with no values")
	}
	a, err := decodeReplyOf(reply[:len(reply)-1])
	a.Receipt.Epoch = uint64(reply[len(reply)-1])
	return a, err
}

// decodeReplyOf reads a script's reply: {allowed, remaining, reset µs,
// retry_after µs[, decision time µs[, units granted[, admission µs]]]};
// the bucket scripts leave out the decision time but for a lease, only a
// lease's admission says what it granted (the sliding log's, every
// admission's), and only the sliding log names the time its admission is
// logged at, when that is not the decision's (see Receipt.Mark). The
// Admission it returns holds nothing yet: the caller says what it holds.
func decodeReplyOf(reply []int64) (limiter.Admission, error) {
	if len(reply) < 4 || len(reply) > 7 {
		return limiter.Admission{}, fmt.Errorf("script replied with %d values, want 4 to 7", len(reply))
	}
	var a limiter.Admission
	a.Decision = limiter.Decision{
		Allowed:    reply[0] == 1,
		Remaining:  reply[1],
		ResetAfter: microseconds(reply[2]),
		RetryAfter: microseconds(reply[3]),
	}
	if len(reply) >= 5 {
		a.Time = reply[4]
		a.Receipt.At = reply[4]
	}
	if len(reply) >= 6 {
		a.Receipt.Granted = reply[5]
	}
	if len(reply) == 7 && reply[6] != a.Time {
		a.Receipt.Mark = reply[6]
	}
	return a, nil
}

// isTimeout reports whether err means a deadline passed, whether go-redis
// returned the context's error, the socket's or the pool's (no connection
// came free within the client's PoolTimeout).
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var (
	_ limiter.Store   = (*Store)(nil)
	_ limiter.Charger = (*Store)(nil)
	_ limiter.Leaser  = (*Store)(nil)
)

// Up reports whether decisions go to Redis now: false while the store's
// breaker has stopped asking a failing Redis, or, on shards, any one
// shard's breaker has stopped asking it.
func (r *Store) Up() bool { return !r.breaker.anyOpen() }

// CheckPolicy reports why the Redis store cannot enforce p exactly,
// as New would refuse it, so a limit set at run time (an override)
// is refused when it is set rather than when a request needs it.
func CheckPolicy(p limiter.Policy) error {
	params, err := p.Compile()
	if err != nil {
		return err
	}
	return checkRedisExact(lookupAlgorithm(p.Algorithm), &params)
}

// holding is a when it refused; when it admitted, a holding held units of
// key in s, the store its units go back to.
func holding(a limiter.Admission, s limiter.Store, key string, held int64) limiter.Admission {
	if !a.Allowed {
		return a
	}
	return limiter.NewAdmission(s, key, held, a.Decision, a.Receipt)
}

// microseconds converts the scripts' microsecond counts to a Duration.
func microseconds(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}

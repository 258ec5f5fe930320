package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/lua"
)

// Runtime overrides of Redis zones live in Redis, one hash per zone (its
// set), so an operator who sets one on any instance sets it for the fleet.
// Every instance keeps the set of each of its zones in an OverrideTable,
// read on every request without a round trip, and keeps it current three
// ways:
//   - every write runs override_set.lua, which writes the record, changes
//     the set's version (field "") and publishes "<previous version>
//     <new version> <zone> <key>" on the set's channel, atomically;
//   - each instance subscribes to the channel of each of its zones: a
//     message whose previous version is the one the instance holds is
//     applied by reading just that key; any other (a message was missed)
//     makes it compare versions and reload the whole set when they differ;
//     so does every (re)subscription, which go-redis makes after every
//     reconnection;
//   - every Refresh, the version is compared again, in case the
//     subscription is down without the instance knowing.

// DefaultOverrideRefresh is how often each zone's set is checked against
// Redis when OverridesOptions.Refresh is zero: the bound on how long
// an instance whose subscription failed unseen runs on an old set.
const DefaultOverrideRefresh = 60 * time.Second

// DefaultOverrideTimeout bounds each call of a load, refresh, set or delete
// when OverridesOptions.Timeout is zero: these run off the request
// path, so the bound is a round trip on a slow network, not a decision's.
const DefaultOverrideTimeout = time.Second

// overrideExpiryMargin is how much longer than its longest-lived record a
// set lives in Redis: instances decide expiry by their own clocks, and one
// whose clock is behind must not lose a record it still applies.
const overrideExpiryMargin = time.Minute

// maxOverrideKeep bounds how long a set is kept for an override's expiry:
// a century, past which an expiry means "never" in all but name.
const maxOverrideKeep = 100 * 365 * 24 * time.Hour

// maxOverrideRecordLen bounds a stored record: Override.MarshalJSON writes
// at most about 130 bytes, so anything longer is not Floodgate's.
const maxOverrideRecordLen = 256

// overridePruneBatch bounds how many lapsed records one load or List
// removes from Redis; the rest go at the next one.
const overridePruneBatch = 1000

// The pause after a failed subscription, doubled at each failure in a row
// up to the longest: Redis is not asked in a loop while it is down.
const (
	subscribeBackoffMin = 50 * time.Millisecond
	subscribeBackoffMax = 2 * time.Second
)

// errOverridesClosed is returned by every method after Close.
var errOverridesClosed = errors.New("runtime overrides closed")

// OverridesOptions configures NewOverrides.
type OverridesOptions struct {
	// Prefix starts every key and channel (escaped like a key part, as the
	// stores' key names are); empty means DefaultPrefix.
	Prefix string
	// Refresh is how often each zone's set is checked against Redis; zero
	// means DefaultOverrideRefresh.
	Refresh time.Duration
	// Timeout bounds each call made for a load, a refresh, a set or a
	// delete; zero means DefaultOverrideTimeout.
	Timeout time.Duration
	// OnChange is called after a key's override changed in a zone's table
	// by a message, a refresh or a reload (set, changed or removed, or
	// lapsed and dropped by a refresh), not for the changes this
	// instance's own Set and Delete make, which their caller handles. The
	// caller gives back the near-cache leases of that key, so none taken
	// under the old limit are spent under the new one. It runs on the
	// zone's goroutines and must not call Set, Delete or Zone. May be nil.
	OnChange func(zone, key string)
	// OnSkip is called for a stored record that cannot be read (corrupt,
	// foreign, too long, under a key no override may have): it is skipped,
	// never applied. May be nil.
	OnSkip func(zone, key string, err error)
	// OnError hears failures of the subscriptions and the refreshes, at
	// most one per attempt; the caller rate-limits its logging. May be nil.
	OnError func(err error)
	// Clock, when set, replaces the wall clock for expiries (what has
	// lapsed, how long a set must live), so tests can step it.
	Clock limiter.Clock
}

// Overrides keeps the runtime overrides of the zones of one Redis (one
// client and key prefix) in Redis, and in every instance's tables; see the
// top of this file for how the instances learn of changes.
type Overrides struct {
	client   redis.UniversalClient
	prefix   string // escaped
	refresh  time.Duration
	timeout  time.Duration
	clock    limiter.Clock
	onChange func(zone, key string)
	onSkip   func(zone, key string, err error)
	onError  func(err error)
	script   *redis.Script
	// most is the most overrides a zone may hold: MaxOverrides, less in
	// tests; mostPrefixes the most of them prefixes':
	// MaxPrefixOverrides, less in tests.
	most, mostPrefixes int
	// genMu makes this instance's SetGen calls one at a time, so they
	// never refuse each other's conditional writes; only other
	// instances' writes can come between a read and its write.
	genMu sync.Mutex

	// ctx ends the zones' goroutines and their calls when Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	zones  map[string]*overrideZone
	closed bool
}

// overrideZone is one zone's table and what keeps it current.
type overrideZone struct {
	r     *Overrides
	name  string
	key   string // the set's Redis key, also its channel
	table *limiter.OverrideTable
	// ctx ends the zone's subscription and refresh: at Close, or at the
	// Release of its last opener (cancel).
	ctx    context.Context
	cancel context.CancelFunc
	// refs counts the Zone calls not yet Released; guarded by r.mu.
	refs int
	// ready is closed once the first load ended; firstErr is its error.
	ready    chan struct{}
	firstErr error

	// mu orders everything that changes the table or version: messages,
	// loads, and the local side of this instance's own writes.
	mu sync.Mutex
	// loaded says the table was loaded whole at least once; version is the
	// set's version the table holds ("" for a set that has none).
	loaded  bool
	version string
	// own are the versions of this instance's writes, so that their
	// messages are not taken for another instance's.
	own map[string]ownWrite
	// loads counts whole loads, so tests can tell that a message was
	// applied by reading its key alone.
	loads atomic.Int64
	// subscriptions counts the subscription's confirmations handled, so
	// tests can wait until a zone hears its messages.
	subscriptions atomic.Int64

	// sub is the subscription to the set's channel.
	sub subscription
}

// ownWrite is where one of this instance's writes stands.
type ownWrite uint8

const (
	// ownPending: the script may be running; its message may come first.
	ownPending ownWrite = iota
	// ownSeen: its message came before the writer took the zone's lock and
	// was applied from what Redis held, so the writer applies nothing.
	ownSeen
	// ownApplied: the writer applied it; its message, when it comes, only
	// moves the version on.
	ownApplied
)

// maxOwnWrites bounds own: entries whose messages never came (the
// subscription was down) are dropped at a reload, or all applied ones
// when there are this many.
const maxOwnWrites = 4096

// NewOverrides returns the runtime overrides kept in client's Redis.
// It starts nothing until Zone is called. The client must honour context
// deadlines, as Config.NewClient's clients do.
func NewOverrides(client redis.UniversalClient, opts OverridesOptions) (*Overrides, error) {
	if client == nil {
		return nil, errors.New("runtime overrides: no Redis client")
	}
	if err := checkContextTimeouts(client); err != nil {
		return nil, fmt.Errorf("runtime overrides: %w", err)
	}
	if opts.Refresh < 0 || opts.Timeout < 0 {
		return nil, fmt.Errorf("runtime overrides: negative refresh %v or timeout %v", opts.Refresh, opts.Timeout)
	}
	r := &Overrides{
		client:       client,
		prefix:       opts.Prefix,
		refresh:      opts.Refresh,
		timeout:      opts.Timeout,
		clock:        opts.Clock,
		onChange:     opts.OnChange,
		onSkip:       opts.OnSkip,
		onError:      opts.OnError,
		script:       redis.NewScript(lua.OverrideSet()),
		zones:        map[string]*overrideZone{},
		most:         limiter.MaxOverrides,
		mostPrefixes: limiter.MaxPrefixOverrides,
	}
	if r.prefix == "" {
		r.prefix = DefaultPrefix
	}
	r.prefix = limiter.EscapeKeyPart(r.prefix)
	if r.refresh == 0 {
		r.refresh = DefaultOverrideRefresh
	}
	if r.timeout == 0 {
		r.timeout = DefaultOverrideTimeout
	}
	if r.clock == nil {
		r.clock = limiter.SystemClock
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// setKey is the Redis key of zone's set, which is also the channel its
// changes are published on: one name, so a Ring (shards) sends the writes,
// the messages and the subscription to one shard. The escaped zone name
// holds no '{', so it never shares a name with a store's keys, which all
// have a hash tag.
func (r *Overrides) setKey(zone string) string {
	return r.prefix + "overrides:" + limiter.EscapeKeyPart(zone)
}

// Zone returns zone's table, shared by every caller for that zone name. On
// the first call for a zone it loads the set from Redis (within ctx) and
// starts the zone's subscription and refresh; if the load fails the table
// is returned empty with the error, and the subscription and refresh fill
// it as soon as Redis answers. A later call waits for that first load and
// returns its error while the table has still not been loaded.
func (r *Overrides) Zone(ctx context.Context, zone string) (*limiter.OverrideTable, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, fmt.Errorf("overrides of zone %q: %w", zone, errOverridesClosed)
	}
	if z, ok := r.zones[zone]; ok {
		z.refs++
		r.mu.Unlock()
		return z.wait(ctx)
	}
	z := &overrideZone{
		r:     r,
		name:  zone,
		key:   r.setKey(zone),
		table: limiter.NewOverrideTable(),
		ready: make(chan struct{}),
		own:   map[string]ownWrite{},
		refs:  1,
	}
	z.ctx, z.cancel = context.WithCancel(r.ctx)
	z.sub = subscription{
		client: r.client, channel: z.key, ctx: z.ctx, timeout: r.timeout,
		// Subscribed anew: whatever was published while it was not is in
		// the set's version.
		subscribed: func() {
			z.check()
			z.subscriptions.Add(1)
		},
		message: z.message,
		fail: func(err error) {
			r.fail(fmt.Errorf("overrides of zone %q: %w", zone, err))
		},
	}
	// Held until the first load ends, so that the first check of the
	// subscription (on its confirmation) finds the table loaded and does
	// not load it again.
	z.mu.Lock()
	r.zones[zone] = z
	r.wg.Add(2)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		z.sub.run()
	}()
	go z.refreshEvery()

	_, lapsed, err := z.loadLocked(ctx)
	z.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("overrides of zone %q: %w", zone, err)
	}
	z.firstErr = err
	close(z.ready)
	r.prune(ctx, zone, z.key, lapsed)
	return z.table, err
}

// Release ends one Zone call's use of zone: once every caller that opened
// it has released it, its subscription and refresh stop (a zone that a
// reload removed holds no connection), and a later Zone opens it afresh.
// The table the callers hold stays readable, no longer updated. Writes,
// lists and Close work as ever.
func (r *Overrides) Release(zone string) {
	r.mu.Lock()
	z := r.zones[zone]
	if z == nil {
		r.mu.Unlock()
		return
	}
	z.refs--
	if z.refs > 0 {
		r.mu.Unlock()
		return
	}
	delete(r.zones, zone)
	r.mu.Unlock()
	z.cancel()
	z.sub.close()
}

// wait is Zone for a zone another call opened.
func (z *overrideZone) wait(ctx context.Context) (*limiter.OverrideTable, error) {
	select {
	case <-z.ready:
	case <-ctx.Done():
		return z.table, fmt.Errorf("overrides of zone %q: waiting for the first load: %w", z.name, ctx.Err())
	}
	z.mu.Lock()
	loaded := z.loaded
	z.mu.Unlock()
	if !loaded && z.firstErr != nil {
		return z.table, z.firstErr
	}
	return z.table, nil
}

// Set writes key's override for zone in Redis, applies it to this
// instance's table at once (when Zone opened the zone here), and
// publishes the change. key is the override's name: a key, or a prefix's
// limiter.PrefixOverrideName. It refuses (ErrInvalidOverride) a name
// limiter.CheckOverrideName refuses, an override Check refuses or whose
// expiry has passed, (ErrTooManyOverrides) a new key when the zone holds
// MaxOverrides already, and (ErrTooManyPrefixOverrides) a new prefix when
// it holds MaxPrefixOverrides prefixes. It writes o's Gen as given.
func (r *Overrides) Set(ctx context.Context, zone, key string, o limiter.Override) error {
	_, err := r.SetGen(ctx, zone, key, o, nil)
	return err
}

// maxSetAttempts bounds how often SetGen reads again after other writers
// changed the key between its read and its write. Each refusal means
// another write landed, so writers at once all finish: only a writer
// outrun this often by other instances' writes of the same key gives up.
const maxSetAttempts = 100

// ErrOverrideConflict is wrapped by SetGen's error when other writers
// changed the key between its read and its write every time it tried:
// nothing was written, and the caller may try again (the admin API
// answers 409).
var ErrOverrideConflict = errors.New("the override was changed by other writers each time it was about to be written")

// SetGen is Set deciding o's Gen by keep (see KeepGen; nil: o's as given)
// from the key's record in Redis as the write finds it: it reads the
// record, chooses, and writes only while the record is still the one it
// read, reading again when another writer came between. So writers on any
// instances, whatever their tables hold yet, never each start the key
// afresh with one limit. It returns the override written, as every
// instance reads it back.
func (r *Overrides) SetGen(ctx context.Context, zone, key string, o limiter.Override, keep limiter.KeepGen) (limiter.Override, error) {
	fail := func(err error) (limiter.Override, error) {
		return limiter.Override{}, fmt.Errorf("override of %q in zone %q: %w", key, zone, err)
	}
	if err := limiter.CheckOverrideName(key); err != nil {
		return fail(fmt.Errorf("%w: %w", limiter.ErrInvalidOverride, err))
	}
	if err := o.Check(); err != nil {
		return fail(fmt.Errorf("%w: %w", limiter.ErrInvalidOverride, err))
	}
	now := r.clock.Now()
	if !o.Active(now) {
		return fail(fmt.Errorf("%w: expires %v, which has passed", limiter.ErrInvalidOverride, o.Expires))
	}
	if keep != nil {
		r.genMu.Lock()
		defer r.genMu.Unlock()
	}
	for attempt := 1; ; attempt++ {
		var expect *string
		if keep != nil {
			raw, old, had, err := r.readRecordOf(ctx, zone, key)
			if err != nil {
				return fail(err)
			}
			o = o.WithGen(old, had, keep)
			expect = &raw
		}
		stored, err := r.setRecord(ctx, zone, key, o, now, expect)
		if errors.Is(err, ErrOverrideConflict) && attempt < maxSetAttempts && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return fail(err)
		}
		return stored, nil
	}
}

// readRecordOf reads key's record in zone's set as stored (raw, "" when
// there is none) and the override it holds (had: one that can be read).
func (r *Overrides) readRecordOf(ctx context.Context, zone, key string) (raw string, o limiter.Override, had bool, err error) {
	callCtx, cancel := r.call(ctx)
	defer cancel()
	raw, err = r.client.HGet(callCtx, r.setKey(zone), key).Result()
	if errors.Is(err, redis.Nil) {
		return "", limiter.Override{}, false, nil
	}
	if err != nil {
		return "", limiter.Override{}, false, fmt.Errorf("reading the override in force: %w", err)
	}
	had = o.UnmarshalJSON([]byte(raw)) == nil
	return raw, o, had, nil
}

// setRecord writes o as key's record (only while the field holds *expect,
// when expect is not nil) and returns it as read back.
func (r *Overrides) setRecord(ctx context.Context, zone, key string, o limiter.Override, now time.Time, expect *string) (limiter.Override, error) {
	rec, err := o.MarshalJSON()
	if err != nil {
		return limiter.Override{}, fmt.Errorf("%w: %w", limiter.ErrInvalidOverride, err)
	}
	// The table holds what every instance reads back from the record
	// (expiry to the ms, window to the µs), not o as given.
	var stored limiter.Override
	if err := stored.UnmarshalJSON(rec); err != nil {
		return limiter.Override{}, err
	}
	var keep int64
	if !o.Expires.IsZero() {
		// Sub saturates near 292 years, and the margin would then wrap
		// the sum negative, which PEXPIRE takes as "delete now": a set
		// kept a century is kept as long as any instance will run.
		keep = (min(o.Expires.Sub(now), maxOverrideKeep) + overrideExpiryMargin).Milliseconds()
	}
	existed, err := r.write(ctx, zone, key, string(rec), keep, &stored, expect)
	switch {
	case err != nil:
		return limiter.Override{}, fmt.Errorf("setting it: %w", err)
	case existed == -1:
		return limiter.Override{}, fmt.Errorf("setting it: %w: the zone holds %d, the most it may", limiter.ErrTooManyOverrides, r.most)
	case existed == -2:
		return limiter.Override{}, ErrOverrideConflict
	case existed == -3:
		return limiter.Override{}, fmt.Errorf("setting it: %w: the zone holds %d, the most it may", limiter.ErrTooManyPrefixOverrides, r.mostPrefixes)
	}
	return stored, nil
}

// Delete removes key's override for zone (in Redis, in this instance's
// table, and by a message in every other's) and reports whether there was
// one. Deleting a key that has none changes nothing and publishes
// nothing.
func (r *Overrides) Delete(ctx context.Context, zone, key string) (bool, error) {
	if err := limiter.CheckOverrideName(key); err != nil {
		return false, fmt.Errorf("override of %q in zone %q: %w: %w", key, zone, limiter.ErrInvalidOverride, err)
	}
	existed, err := r.write(ctx, zone, key, "", 0, nil, nil)
	if err != nil {
		return false, fmt.Errorf("deleting the override of %q in zone %q: %w", key, zone, err)
	}
	return existed > 0, nil
}

// write runs override_set.lua for one key (rec "" deletes it), only while
// the field holds *expect when expect is not nil, and applies the write
// to the zone's table when the zone is open here; o is the record as read
// back, nil for a delete. It returns the script's existed (1, 0, -1 for a
// set that is full, -2 for a field that no longer held *expect, -3 for a
// new prefix in a set that holds as many as it may).
func (r *Overrides) write(ctx context.Context, zone, key, rec string, keep int64, o *limiter.Override, expect *string) (int64, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0, errOverridesClosed
	}
	z := r.zones[zone]
	r.mu.Unlock()

	next := newOverrideVersion()
	if z != nil {
		z.mu.Lock()
		z.own[next] = ownPending
		z.mu.Unlock()
	}
	set := r.setKey(zone)
	callCtx, cancel := r.call(ctx)
	args := []any{key, rec, next, keep, set, zone, r.most, limiter.PrefixCountField, r.mostPrefixes}
	if expect != nil {
		args = append(args, *expect)
	}
	reply, err := r.script.Run(callCtx, r.client, []string{set}, args...).Slice()
	cancel()
	var existed int64
	var prev string
	if err == nil {
		existed, prev, err = readSetReply(reply)
	} else {
		err = nameScriptDenial(err, map[string]string{r.script.Hash(): lua.OverrideSet()})
	}
	if z == nil {
		return existed, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	state := z.own[next]
	delete(z.own, next)
	if err != nil || existed < 0 {
		// Nothing written, as far as this instance knows: a write whose
		// reply was lost comes back as any other instance's message.
		return existed, err
	}
	if rec == "" && existed == 0 {
		// Nothing to delete in Redis, so none in the table either, should
		// it still hold a delete it missed.
		z.table.Remove(key)
		return existed, nil
	}
	switch {
	case state == ownSeen:
		// Its message came first and was applied from what Redis held
		// then, this write or a later one.
	case z.loaded && z.version == prev:
		// Nothing came between the table's version and this write.
		if o != nil {
			z.table.Put(key, *o)
		} else {
			z.table.Remove(key)
		}
		z.version = next
		z.own[next] = ownApplied
	default:
		// Writes this instance has not applied came before this one, or
		// after it: take what Redis holds for the key now, and leave the
		// version for the next message or refresh to bring the rest.
		if _, err := z.applyKeyLocked(ctx, key); err != nil {
			if o != nil {
				z.table.Put(key, *o)
			} else {
				z.table.Remove(key)
			}
		}
		z.own[next] = ownApplied
	}
	if len(z.own) > maxOwnWrites {
		z.forgetOwnLocked()
	}
	return existed, nil
}

// readSetReply reads override_set.lua's reply: {existed, previous
// version}.
func readSetReply(reply []any) (int64, string, error) {
	if len(reply) != 2 {
		return 0, "", fmt.Errorf("override script replied with %d values, want 2", len(reply))
	}
	existed, ok1 := reply[0].(int64)
	prev, ok2 := reply[1].(string)
	if !ok1 || !ok2 {
		return 0, "", fmt.Errorf("override script replied %T, %T; want an integer and a string", reply[0], reply[1])
	}
	return existed, prev, nil
}

// List reads zone's overrides from Redis (not this instance's table),
// skipping lapsed and unreadable ones, so what the admin API lists is
// what the fleet applies. Lapsed records it finds are removed from Redis,
// best effort.
func (r *Overrides) List(ctx context.Context, zone string) (map[string]limiter.Override, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("listing the overrides of zone %q: %w", zone, errOverridesClosed)
	}
	setKey := r.setKey(zone)
	_, h, err := r.scanSet(ctx, setKey)
	if err != nil {
		return nil, fmt.Errorf("listing the overrides of zone %q: %w", zone, err)
	}
	_, set, lapsed := r.readSet(zone, "", h)
	r.prune(ctx, zone, setKey, lapsed)
	return set, nil
}

// Close stops every subscription and refresh goroutine and waits for them.
// The tables stay as they were; every method fails after it.
func (r *Overrides) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	zones := make([]*overrideZone, 0, len(r.zones))
	for _, z := range r.zones {
		zones = append(zones, z)
	}
	r.mu.Unlock()
	r.cancel()
	for _, z := range zones {
		z.sub.close()
	}
	r.wg.Wait()
	return nil
}

// refreshEvery checks the zone's set every Refresh until Close or Release, and drops
// the overrides that lapsed.
func (z *overrideZone) refreshEvery() {
	defer z.r.wg.Done()
	t := time.NewTicker(z.r.refresh)
	defer t.Stop()
	for {
		select {
		case <-z.ctx.Done():
			return
		case <-t.C:
		}
		z.check()
		z.r.notify(z.name, z.table.RemoveExpired(z.r.clock.Now()))
	}
}

// check compares the set's version with the table's and reloads the set
// when they differ.
func (z *overrideZone) check() {
	ctx := z.ctx
	z.mu.Lock()
	changed, lapsed, err := z.checkLocked(ctx)
	z.mu.Unlock()
	z.after(ctx, changed, lapsed, err)
}

// message applies one message of the zone's channel.
func (z *overrideZone) message(payload string) {
	ctx := z.ctx
	z.mu.Lock()
	changed, lapsed, err := z.messageLocked(ctx, payload)
	z.mu.Unlock()
	z.after(ctx, changed, lapsed, err)
}

// after tells OnChange of the changed keys, prunes lapsed records and
// reports err, outside the zone's lock.
func (z *overrideZone) after(ctx context.Context, changed []string, lapsed map[string]string, err error) {
	z.r.notify(z.name, changed)
	z.r.prune(ctx, z.name, z.key, lapsed)
	if err != nil && z.ctx.Err() == nil {
		z.r.fail(fmt.Errorf("overrides of zone %q: %w", z.name, err))
	}
}

// messageLocked applies a message: the one key it names when the table
// holds the version the message starts from, else whatever check finds.
func (z *overrideZone) messageLocked(ctx context.Context, payload string) ([]string, map[string]string, error) {
	prev, next, key, ok := parseOverrideMessage(payload, z.name)
	if !ok {
		// Not Floodgate's message, or not this zone's: it may still mean
		// the set changed.
		return z.checkLocked(ctx)
	}
	own, isOwn := z.own[next]
	switch {
	case isOwn && own == ownApplied:
		delete(z.own, next)
		if z.version == prev {
			z.version = next
		}
		return nil, nil, nil
	case isOwn:
		z.own[next] = ownSeen
	}
	if z.loaded && z.version == next {
		return nil, nil, nil // a load read it already
	}
	if !z.loaded || z.version != prev {
		return z.checkLocked(ctx) // a message was missed, or is still to come
	}
	changed, err := z.applyKeyLocked(ctx, key)
	if err != nil {
		return nil, nil, err // the version stays, so the next message or refresh reloads
	}
	z.version = next
	if !changed || isOwn {
		return nil, nil, nil
	}
	return []string{key}, nil, nil
}

// applyKeyLocked reads key's record from Redis and puts it in the table,
// or removes the key when it has none (or an unreadable or lapsed one);
// it reports whether the table changed.
func (z *overrideZone) applyKeyLocked(ctx context.Context, key string) (bool, error) {
	ctx, cancel := z.r.call(ctx)
	defer cancel()
	v, err := z.r.client.HGet(ctx, z.key, key).Result()
	if errors.Is(err, redis.Nil) {
		return z.table.Remove(key), nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the override of %q: %w", key, err)
	}
	o, ok := z.r.readRecord(z.name, key, v)
	if !ok || !o.Active(z.r.clock.Now()) {
		return z.table.Remove(key), nil
	}
	return z.table.Put(key, o), nil
}

// checkLocked reloads the set unless Redis holds the version the table
// does. It returns the keys whose override changed and the lapsed records
// to prune.
func (z *overrideZone) checkLocked(ctx context.Context) ([]string, map[string]string, error) {
	if z.loaded {
		callCtx, cancel := z.r.call(ctx)
		v, err := z.r.client.HGet(callCtx, z.key, "").Result()
		cancel()
		switch {
		case errors.Is(err, redis.Nil):
			v = "" // no set, or one without a version: none
		case err != nil && !isWrongType(err):
			return nil, nil, fmt.Errorf("reading the version of %s: %w", z.key, err)
		}
		if err == nil || errors.Is(err, redis.Nil) {
			if v == z.version {
				return nil, nil, nil
			}
		}
	}
	return z.loadLocked(ctx)
}

// loadLocked reads the whole set and makes the table hold it. A key of
// another type is as good as no set: the table is emptied and the error
// says what holds the name.
func (z *overrideZone) loadLocked(ctx context.Context) ([]string, map[string]string, error) {
	z.loads.Add(1)
	version, h, err := z.r.scanSet(ctx, z.key)
	if err != nil {
		if !isWrongType(err) {
			return nil, nil, fmt.Errorf("loading %s: %w", z.key, err)
		}
		changed := z.table.Replace(map[string]limiter.Override{})
		z.loaded, z.version = false, ""
		return changed, nil, fmt.Errorf("loading %s: it is not a hash, so the zone has no overrides until it is deleted: %w", z.key, err)
	}
	_, set, lapsed := z.r.readSet(z.name, version, h)
	changed := z.table.Replace(set)
	z.loaded, z.version = true, version
	z.forgetOwnLocked()
	return changed, lapsed, nil
}

// forgetOwnLocked drops the own writes that are no longer pending: after
// a reload their messages, should they still come, are told apart by the
// version.
func (z *overrideZone) forgetOwnLocked() {
	for v, s := range z.own {
		if s != ownPending {
			delete(z.own, v)
		}
	}
}

// readSet splits a zone's set as scanSet returns it into the overrides in
// force and the lapsed records (by key, as stored); it passes version
// through. Records that cannot be read are skipped through OnSkip; past
// MaxOverrides the rest are skipped with one OnError.
func (r *Overrides) readSet(zone, version string, h map[string]string) (string, map[string]limiter.Override, map[string]string) {
	now := r.clock.Now()
	set := make(map[string]limiter.Override, len(h))
	var lapsed map[string]string
	extra, extraPrefixes, prefixes := 0, 0, 0
	for k, v := range h {
		if k == "" || k == limiter.PrefixCountField {
			continue
		}
		o, ok := r.readRecord(zone, k, v)
		_, isPrefix := limiter.OverridePrefix(k)
		switch {
		case !ok:
		case !o.Active(now):
			if lapsed == nil {
				lapsed = map[string]string{}
			}
			lapsed[k] = v
		case len(set) >= r.most:
			extra++
		case isPrefix && prefixes >= r.mostPrefixes:
			extraPrefixes++
		default:
			set[k] = o
			if isPrefix {
				prefixes++
			}
		}
	}
	if extra > 0 {
		r.fail(fmt.Errorf("overrides of zone %q: the set holds %d more than the %d a zone may; they are skipped", zone, extra, r.most))
	}
	if extraPrefixes > 0 {
		r.fail(fmt.Errorf("overrides of zone %q: the set holds %d more prefixes than the %d a zone may; they are skipped", zone, extraPrefixes, r.mostPrefixes))
	}
	return version, set, lapsed
}

// readRecord reads one stored record, reporting it through OnSkip when it
// cannot be applied.
func (r *Overrides) readRecord(zone, key, v string) (limiter.Override, bool) {
	var o limiter.Override
	err := limiter.CheckOverrideName(key)
	if err == nil && len(v) > maxOverrideRecordLen {
		err = fmt.Errorf("override record of %d bytes, more than %d", len(v), maxOverrideRecordLen)
	}
	if err == nil {
		err = o.UnmarshalJSON([]byte(v))
	}
	if err != nil {
		if r.onSkip != nil {
			if len(key) > limiter.MaxOverrideNameLen {
				key = key[:limiter.MaxOverrideNameLen]
			}
			r.onSkip(zone, key, err)
		}
		return limiter.Override{}, false
	}
	return o, true
}

// prune removes lapsed records (by key, with the record as read) from
// zone's set, at most overridePruneBatch of them, each only while it
// still holds that record, so one written again meanwhile stays. The
// removals change no version and publish nothing: no instance applies a
// lapsed record anyway. Best effort: a failure goes to OnError.
func (r *Overrides) prune(ctx context.Context, zone, setKey string, lapsed map[string]string) {
	if len(lapsed) == 0 || ctx.Err() != nil {
		return
	}
	ctx, cancel := r.call(ctx)
	defer cancel()
	args := func(k, v string) []any { return []any{k, "", "", 0, setKey, zone, 0, limiter.PrefixCountField, 0, v} }
	keys := []string{setKey}
	n := 0
	var first, err error
	pipe := r.client.Pipeline()
	for k, v := range lapsed {
		if n == 0 {
			// Run loads the script if Redis lacks it; the rest share one
			// round trip.
			first = r.script.Run(ctx, r.client, keys, args(k, v)...).Err()
			if first != nil {
				break
			}
		} else {
			r.script.EvalSha(ctx, pipe, keys, args(k, v)...)
		}
		if n++; n == overridePruneBatch {
			break
		}
	}
	if first == nil && n > 1 {
		_, err = pipe.Exec(ctx)
	}
	if err = errors.Join(first, err); err != nil {
		r.fail(fmt.Errorf("overrides of zone %q: removing lapsed overrides: %w", zone, err))
	}
}

// call bounds one call to Redis made within ctx by the timeout.
func (r *Overrides) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// scanChunk is how many fields one HSCAN call asks for.
const scanChunk = 1000

// scanSet reads a zone's set: its version, read first, and then every
// field in chunks of about scanChunk by HSCAN, each call bounded by the
// timeout, so a large set neither holds up Redis (as one HGETALL of
// 100,000 fields would, and every decision of the instances with it) nor
// needs a longer timeout. The chunks are not one snapshot: a write made
// during the scan may be read or not, but its message starts from a
// version no earlier than the one returned, so it is applied after the
// load whichever it was. A missing set is version "" with no fields.
func (r *Overrides) scanSet(ctx context.Context, key string) (string, map[string]string, error) {
	callCtx, cancel := r.call(ctx)
	version, err := r.client.HGet(callCtx, key, "").Result()
	cancel()
	switch {
	case errors.Is(err, redis.Nil):
		version = ""
	case err != nil:
		return "", nil, err
	}
	h := map[string]string{}
	var cursor uint64
	for {
		callCtx, cancel := r.call(ctx)
		kvs, next, err := r.client.HScan(callCtx, key, cursor, "", scanChunk).Result()
		cancel()
		if err != nil {
			return "", nil, err
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			h[kvs[i]] = kvs[i+1]
		}
		if next == 0 {
			return version, h, nil
		}
		cursor = next
	}
}

// notify tells OnChange of each key.
func (r *Overrides) notify(zone string, keys []string) {
	if r.onChange == nil {
		return
	}
	for _, k := range keys {
		r.onChange(zone, k)
	}
}

// fail tells OnError of err.
func (r *Overrides) fail(err error) {
	if r.onError != nil {
		r.onError(err)
	}
}

// parseOverrideMessage reads "<previous>\n<new>\n<zone>\n<key>", which
// override_set.lua publishes, for zone. ok is false for anything else.
func parseOverrideMessage(payload, zone string) (prev, next, key string, ok bool) {
	prev, rest, ok1 := strings.Cut(payload, "\n")
	next, rest, ok2 := strings.Cut(rest, "\n")
	key, ok3 := strings.CutPrefix(rest, zone+"\n")
	if !ok1 || !ok2 || !ok3 || next == "" || limiter.CheckOverrideName(key) != nil {
		return "", "", "", false
	}
	return prev, next, key, true
}

// newOverrideVersion is a set's new version: 16 random hex digits.
func newOverrideVersion() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand aborts the program instead
	return hex.EncodeToString(b[:])
}

// isWrongType reports whether err is Redis's refusal of a command on a key
// of another type.
func isWrongType(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") }

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Lease reclaims. Near caches on several instances lease units of one key;
// when one instance is refused a key while others hold unspent units of it,
// those units would come back only when their leases lapse, up to a second
// later, and a burst spread over instances would be refused short of its
// limit. So the refused instance asks the others for them: it publishes the
// key's name (its Redis key, never the client's key) on its zone's reclaim
// channel, every instance subscribes to the channels of its zones, and one
// that holds leases of that key returns them (nearcache.Cache.ReturnNamed),
// within a round trip or two.
//
// Pub/Sub, because a reclaim is a hint that may be lost at no cost but
// time (the leases lapse within a second anyway), wants no reply and no
// state in Redis, and must reach every instance at once within a
// millisecond or so: what Redis Pub/Sub is, and the same plumbing the
// runtime overrides use (subscription). A stream or a list would store
// every request and need each instance to poll or block on it; keeping in
// Redis which instance holds leases of which key would cost a write per
// lease, the very calls leases save.

// Reclaims carries reclaim requests between the instances that share one
// Redis (one client and key prefix).
type Reclaims struct {
	client  redis.UniversalClient
	prefix  string // escaped
	timeout time.Duration
	onError func(err error)
	// id tells this instance's requests from the others', so it does not
	// answer its own.
	id string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	zones  map[string]*reclaimZone
	closed bool
}

// ReclaimsOptions configures NewReclaims.
type ReclaimsOptions struct {
	// Prefix starts every channel, as Options.Prefix starts the stores'
	// keys; empty means DefaultPrefix.
	Prefix string
	// Timeout bounds each publish and subscribe call; zero means
	// DefaultOverrideTimeout.
	Timeout time.Duration
	// OnError hears failures of the subscriptions and of publishing; the
	// caller rate-limits its logging. May be nil.
	OnError func(err error)
}

// reclaimZone is one zone's subscription and the listeners it calls.
type reclaimZone struct {
	name    string
	channel string
	cancel  context.CancelFunc
	sub     subscription
	// listeners are the Listen calls not yet stopped, by number; guarded
	// by Reclaims.mu.
	listeners map[int]func(name string)
	next      int
	// subscriptions counts the subscription's confirmations, so tests can
	// wait until the zone hears requests.
	subscriptions atomic.Int64
}

// NewReclaims returns the reclaim channels of client's Redis. It starts
// nothing until Listen is called. The client must honour context
// deadlines, as Config.NewClient's clients do.
func NewReclaims(client redis.UniversalClient, opts ReclaimsOptions) (*Reclaims, error) {
	if client == nil {
		return nil, errors.New("lease reclaims: no Redis client")
	}
	if err := checkContextTimeouts(client); err != nil {
		return nil, fmt.Errorf("lease reclaims: %w", err)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("lease reclaims: negative timeout %v", opts.Timeout)
	}
	r := &Reclaims{client: client, prefix: opts.Prefix, timeout: opts.Timeout, onError: opts.OnError,
		id: newOverrideVersion(), zones: map[string]*reclaimZone{}}
	if r.prefix == "" {
		r.prefix = DefaultPrefix
	}
	r.prefix = limiter.EscapeKeyPart(r.prefix)
	if r.timeout == 0 {
		r.timeout = DefaultOverrideTimeout
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// channel is zone's reclaim channel. The escaped zone name holds no '{',
// so it never shares a name with a store's keys, which all have a hash
// tag, nor with an override set's, whose name goes on with "overrides:".
func (r *Reclaims) channel(zone string) string {
	return r.prefix + "reclaim:" + limiter.EscapeKeyPart(zone)
}

// ReclaimListener is one Listen of a zone: one near cache's (or one
// handler's) ear on the zone's requests, and its voice. Several handlers
// of one process may serve a zone, each with its own leases, so a request
// reaches every listener but the one that asked, in this process and in
// the others.
type ReclaimListener struct {
	r    *Reclaims
	z    *reclaimZone // nil once Reclaims was closed before Listen
	n    int
	once sync.Once
}

// Listen calls on with the name of each key of zone whose leases another
// listener asks back, on the zone's subscription goroutine or the asking
// listener's publishing one (on must not block: it returns the leases in
// the background). It subscribes to the zone's channel on the first
// Listen of the zone; Stop ends this Listen, and the last one the
// subscription.
func (r *Reclaims) Listen(zone string, on func(name string)) *ReclaimListener {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return &ReclaimListener{r: r}
	}
	z := r.zones[zone]
	if z == nil {
		z = &reclaimZone{name: zone, channel: r.channel(zone), listeners: map[int]func(string){}}
		ctx, cancel := context.WithCancel(r.ctx)
		z.cancel = cancel
		z.sub = subscription{
			client: r.client, channel: z.channel, ctx: ctx, timeout: r.timeout,
			subscribed: func() { z.subscriptions.Add(1) },
			message:    func(payload string) { r.heard(z, payload) },
			fail: func(err error) {
				r.fail(fmt.Errorf("lease reclaims of zone %q: %w", zone, err))
			},
		}
		r.zones[zone] = z
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			z.sub.run()
		}()
	}
	n := z.next
	z.next++
	z.listeners[n] = on
	return &ReclaimListener{r: r, z: z, n: n}
}

// Stop ends l's listening, once; l asks nothing afterwards.
func (l *ReclaimListener) Stop() {
	if l.z == nil {
		return
	}
	l.once.Do(func() { l.r.unlisten(l.z, l.n) })
}

// unlisten ends Listen n of z, and z's subscription with its last one.
func (r *Reclaims) unlisten(z *reclaimZone, n int) {
	r.mu.Lock()
	delete(z.listeners, n)
	last := len(z.listeners) == 0 && r.zones[z.name] == z
	if last {
		delete(r.zones, z.name)
	}
	r.mu.Unlock()
	if last {
		z.cancel()
		z.sub.close()
	}
}

// heard handles one request of z's channel: "<instance> <name>". This
// process's own requests reached its listeners when they were asked.
func (r *Reclaims) heard(z *reclaimZone, payload string) {
	from, name, ok := strings.Cut(payload, " ")
	if !ok || from == r.id || name == "" {
		return
	}
	for _, on := range r.listenersOf(z, -1) {
		on(name)
	}
}

// listenersOf lists z's listeners but number except.
func (r *Reclaims) listenersOf(z *reclaimZone, except int) []func(string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ons := make([]func(string), 0, len(z.listeners))
	for n, on := range z.listeners {
		if n != except {
			ons = append(ons, on)
		}
	}
	return ons
}

// Ask asks every other listener of l's zone, in this process and in the
// other instances, to return their leases of the key whose name
// (Store.Key) is name. In the background, it tells this process's other
// listeners at once and publishes within the timeout; a request that
// fails is lost, as a hint may be.
func (l *ReclaimListener) Ask(name string) {
	r, z := l.r, l.z
	r.mu.Lock()
	if r.closed || z == nil || z.listeners[l.n] == nil {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		for _, on := range r.listenersOf(z, l.n) {
			on(name)
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		defer cancel()
		if err := publish(ctx, r.client, z.channel, r.id+" "+name); err != nil && r.ctx.Err() == nil {
			r.fail(fmt.Errorf("lease reclaims of zone %q: asking for %s: %w", z.name, name, err))
		}
	}()
}

// Close ends every subscription and waits for them and for the requests
// being published.
func (r *Reclaims) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	zones := make([]*reclaimZone, 0, len(r.zones))
	for _, z := range r.zones {
		zones = append(zones, z)
	}
	r.zones = map[string]*reclaimZone{}
	r.mu.Unlock()
	r.cancel()
	for _, z := range zones {
		z.sub.close()
	}
	r.wg.Wait()
	return nil
}

// Listening reports whether zone's subscription has been confirmed: from
// then on this instance hears the zone's requests.
func (r *Reclaims) Listening(zone string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	z := r.zones[zone]
	return z != nil && z.subscriptions.Load() > 0
}

// fail tells OnError of err.
func (r *Reclaims) fail(err error) {
	if r.onError != nil {
		r.onError(err)
	}
}

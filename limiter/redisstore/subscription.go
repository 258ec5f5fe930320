package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// errSubscriptionClosed ends a subscription's loop once it is closed.
var errSubscriptionClosed = errors.New("subscription closed")

// subscription receives one channel's messages until its context ends or
// it is closed, resubscribing (with a pause that grows while it fails)
// after every error. Runtime overrides (a zone's set) and lease reclaims (a
// zone's requests for leases back) each keep one per zone.
//
// On a Ring (shards) it subscribes on the channel's shard itself, whose
// Subscribe does not panic as the Ring's does when the Ring is closed;
// publishers send to that shard too (publish). On a Cluster, PUBLISH
// reaches every node, so any node's subscription hears it.
type subscription struct {
	client  redis.UniversalClient
	channel string
	ctx     context.Context
	// timeout bounds the SUBSCRIBE call.
	timeout time.Duration
	// subscribed runs on each (re)subscription's confirmation: whatever
	// was published while there was none was missed. May be nil.
	subscribed func()
	// message runs for each message, on the subscription's goroutine.
	message func(payload string)
	// fail hears each failure, at most one per attempt.
	fail func(err error)

	mu     sync.Mutex
	ps     *redis.PubSub
	closed bool
}

// run receives the channel's messages until the context ends or close.
func (s *subscription) run() {
	var ps *redis.PubSub
	var backoff time.Duration
	for s.ctx.Err() == nil {
		if ps == nil {
			var err error
			if ps, err = s.open(); err != nil {
				if errors.Is(err, errSubscriptionClosed) {
					return
				}
				s.fail(fmt.Errorf("subscribing to %s: %w", s.channel, err))
				if !s.pause(&backoff) {
					return
				}
				continue
			}
		}
		// go-redis reconnects and resubscribes by itself after an error,
		// and the next Receive then returns the new subscription's
		// confirmation.
		msg, err := ps.Receive(s.ctx)
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			s.fail(fmt.Errorf("subscription to %s: %w", s.channel, err))
			if !s.pause(&backoff) {
				return
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && s.subscribed != nil {
				s.subscribed()
			}
		case *redis.Message:
			s.message(m.Payload)
		}
	}
}

// open subscribes to the channel.
func (s *subscription) open() (*redis.PubSub, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errSubscriptionClosed
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	var ps *redis.PubSub
	if ring, ok := s.client.(*redis.Ring); ok {
		shard, err := ring.GetShardClientForKey(s.channel)
		if err != nil {
			return nil, err
		}
		ps = shard.Subscribe(ctx, s.channel)
	} else {
		ps = s.client.Subscribe(ctx, s.channel)
	}
	s.ps = ps
	return ps, nil
}

// close closes the subscription, which ends a Receive waiting on it.
func (s *subscription) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.ps != nil {
		_ = s.ps.Close()
	}
}

// pause waits out *backoff, grown for the next failure, unless the
// context ends first; it reports whether to go on.
func (s *subscription) pause(backoff *time.Duration) bool {
	*backoff = min(max(2**backoff, subscribeBackoffMin), subscribeBackoffMax)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// publish sends payload on channel, on a Ring to the channel's shard,
// where its subscribers listen.
func publish(ctx context.Context, client redis.UniversalClient, channel, payload string) error {
	if ring, ok := client.(*redis.Ring); ok {
		shard, err := ring.GetShardClientForKey(channel)
		if err != nil {
			return err
		}
		return shard.Publish(ctx, channel, payload).Err()
	}
	return client.Publish(ctx, channel, payload).Err()
}

package jwtauth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// Defaults of the JWKS fetcher, used where Options leaves a zero.
const (
	defaultJWKSRefresh      = 5 * time.Minute
	defaultJWKSMissInterval = time.Minute
	defaultJWKSRetryMin     = 5 * time.Second
	// jwksTimeout bounds one fetch, connection and body included.
	jwksTimeout = 10 * time.Second
	// maxJWKSBody bounds the response body; real key sets are a few KiB.
	maxJWKSBody = 1 << 20
)

// jwksSource keeps the key set of a JWKS URL current: fetched once at New,
// again every refresh interval, and on demand (at most once per
// missInterval) when a token names a kid the set does not hold. Requests
// only ever load the current set atomically; fetching happens in its own
// goroutine.
type jwksSource struct {
	url string
	// shown is url as errors and logs show it: a password in its
	// userinfo replaced (url.URL.Redacted).
	shown        string
	client       *http.Client
	logger       *zap.Logger
	refresh      time.Duration
	missInterval time.Duration
	retryMin     time.Duration
	clock        limiter.Clock

	set      atomic.Pointer[keySet]
	lastMiss atomic.Int64 // UnixNano of the last refetch a kid miss asked for
	kick     chan struct{}
	fetches  atomic.Int64 // completed fetch attempts, for tests and logs

	// lastBody is the digest of the last document fetched; only the
	// fetching goroutine (or New, before it starts) touches it.
	lastBody [sha256.Size]byte

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// newJWKSSource returns a source for o.JWKSURL holding an empty set, with
// o's zero timings replaced by the defaults. Nothing is fetched yet.
func newJWKSSource(o *Options, clock limiter.Clock, logger *zap.Logger) *jwksSource {
	s := &jwksSource{
		url:          o.JWKSURL,
		shown:        redactedURL(o.JWKSURL),
		client:       o.HTTPClient,
		logger:       logger.With(zap.String("jwks_url", redactedURL(o.JWKSURL))),
		refresh:      cmpOr(o.JWKSRefresh, defaultJWKSRefresh),
		missInterval: cmpOr(o.JWKSMissInterval, defaultJWKSMissInterval),
		retryMin:     cmpOr(o.JWKSRetryMin, defaultJWKSRetryMin),
		clock:        clock,
		kick:         make(chan struct{}, 1),
	}
	if s.client == nil {
		s.client = &http.Client{Timeout: jwksTimeout}
	}
	s.set.Store(newKeySet(nil, false, 0))
	return s
}

// cmpOr returns d, or def when d is not positive.
func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// current returns the key set in use; never nil.
func (s *jwksSource) current() *keySet { return s.set.Load() }

// fetch downloads and installs the key set. On any failure the previous set
// stays in use.
func (s *jwksSource) fetch(ctx context.Context) error {
	defer s.fetches.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return fmt.Errorf("fetching JWKS %s: %w", s.shown, err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("fetching JWKS %s: %w", s.shown, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching JWKS %s: status %s", s.shown, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBody+1))
	if err != nil {
		return fmt.Errorf("reading JWKS %s: %w", s.shown, err)
	}
	if len(body) > maxJWKSBody {
		return fmt.Errorf("reading JWKS %s: body larger than %d bytes", s.shown, maxJWKSBody)
	}
	digest := sha256.Sum256(body)
	if digest == s.lastBody && len(s.current().keys) > 0 {
		return nil // unchanged: keep the generation, so cached tokens survive
	}
	keys, skipped, err := parseJWKS(body)
	for _, e := range skipped {
		s.logger.Warn("JWKS key skipped", zap.Error(e))
	}
	if err != nil {
		return fmt.Errorf("parsing JWKS %s: %w", s.shown, err)
	}
	s.lastBody = digest
	s.set.Store(newKeySet(keys, false, s.current().gen+1))
	s.logger.Debug("JWKS loaded", zap.Int("keys", len(keys)))
	return nil
}

// requestRefetch asks the background goroutine for a fetch because a token
// named an unknown kid. It never blocks, and asks at most once per
// missInterval.
func (s *jwksSource) requestRefetch() {
	now := s.clock.Now().UnixNano()
	last := s.lastMiss.Load()
	if last != 0 && now-last < int64(s.missInterval) {
		return
	}
	if !s.lastMiss.CompareAndSwap(last, now) {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// start launches the refresh goroutine; ok tells whether the first fetch
// succeeded (if not, it retries sooner than the refresh interval).
func (s *jwksSource) start(parent context.Context, ok bool) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	s.done = make(chan struct{})
	go s.run(ctx, ok)
}

func (s *jwksSource) run(ctx context.Context, ok bool) {
	defer close(s.done)
	retry := s.retryMin
	next := func(ok bool) time.Duration {
		if ok {
			retry = s.retryMin
			return s.refresh
		}
		wait := min(retry, s.refresh)
		retry = min(2*retry, s.refresh)
		return wait
	}
	timer := time.NewTimer(next(ok))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.kick:
		}
		err := s.fetch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.logger.Error("JWKS refresh failed; keeping the previous keys", zap.Error(err))
		}
		timer.Reset(next(err == nil))
	}
}

// close stops the refresh goroutine and waits for it; safe to call twice.
func (s *jwksSource) close() {
	s.closeOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
	})
}

// redactedURL is raw with the password of its userinfo replaced, so
// neither an error nor a log line shows it.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

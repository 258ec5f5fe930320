package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits the rate of requests per zone. Each zone picks the
// requests it applies to (match), how they are grouped (key), and the limit
// and algorithm that bound each group. A request that exceeds any zone's
// limit is refused with HTTP 429 and consumes nothing from the other zones;
// the refusal is returned as an error, so `handle_errors` can render it.
//
// Every response of a request that at least one zone evaluated carries
// `X-RateLimit-*` headers and the IETF `RateLimit` and `RateLimit-Policy`
// fields, unless `headers` says otherwise.
type Handler struct {
	// RateLimits are the zones, keyed by name. A zone's state (its
	// counters) is identified by its name and its limit: it survives a
	// config reload that keeps both, and two handlers that declare the
	// same zone name with the same limit share one set of counters.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// Headers selects the rate-limit response headers: "both" (default),
	// "x-ratelimit", "ietf" or "none".
	Headers string `json:"headers,omitempty"`

	// LogKey logs the raw key of each denied request. Off by default,
	// because keys can hold API keys or tokens.
	LogKey bool `json:"log_key,omitempty"`

	// SweepInterval is how often the memory store forgets keys whose
	// state is back to empty. Default: 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// MaxKeys bounds the keys the memory store keeps per zone; beyond it
	// the least recently used key is forgotten. Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	// Jitter adds up to this fraction of the wait to Retry-After (0.2
	// adds up to 20%), so refused clients do not all retry at once.
	Jitter float64 `json:"jitter,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Distributed is accepted for compatibility with
	// mholt/caddy-ratelimit and ignored with a warning: use a zone's
	// `store redis` to share limits between instances.
	Distributed json.RawMessage `json:"distributed,omitempty"`

	// StorageRaw is accepted for compatibility with
	// mholt/caddy-ratelimit and ignored with a warning, as Distributed.
	StorageRaw json.RawMessage `json:"storage,omitempty"`

	zones   []*zone
	headers headerMode
	logger  *zap.Logger
	sweeper *sweeper
}

// Zone is one rate limit.
type Zone struct {
	// MatcherSetsRaw selects the requests this zone applies to; empty
	// means every request the handler sees.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key groups requests: each distinct value has its own limit. Any
	// placeholders are allowed ("{http.request.header.X-API-Key}",
	// "{http.vars.client_ip}:{http.request.uri.path}"). Empty means the
	// client IP. A key without placeholders is one limit shared by every
	// request. Keys are hashed before they are stored.
	Key string `json:"key,omitempty"`

	// Algorithm is token_bucket, leaky_bucket, fixed_window,
	// sliding_window_log (default), sliding_window_counter or concurrency.
	Algorithm string `json:"algorithm,omitempty"`

	// MaxEvents is the quota: units per window (for concurrency, requests
	// in flight).
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is the period the quota applies to. For concurrency it is
	// the lease that bounds how long a crashed instance's requests hold
	// their slots in Redis (default 1m).
	Window caddy.Duration `json:"window,omitempty"`

	// Burst is the capacity of a token or leaky bucket. Default: max_events.
	Burst int64 `json:"burst,omitempty"`

	// Cost is how many units one request consumes. Default: 1.
	Cost int64 `json:"cost,omitempty"`

	// MaxDelay is, for leaky_bucket, the longest a request may be held to
	// space requests out. Default: (burst-1)/rate, which admits burst
	// requests at once.
	MaxDelay *caddy.Duration `json:"max_delay,omitempty"`

	// Store is "memory" (default: this instance only).
	Store string `json:"store,omitempty"`

	// MissingKey says what happens when the key evaluates empty: "ip"
	// (default) limits the request by client IP instead, in a namespace of
	// its own; "deny" refuses it with 429; "skip" lets it through
	// unlimited by this zone.
	MissingKey string `json:"missing_key,omitempty"`

	// IPv4Prefix groups IPv4 clients: a key value that is an IPv4 address
	// is masked to this many bits. Default: 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups IPv6 clients, as IPv4Prefix. Default: 64, so
	// clients rotating through one /64 share a limit.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// DryRun decides, counts, logs and sets headers, but never refuses.
	DryRun bool `json:"dry_run,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the zones and their stores.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.Validate(); err != nil {
		return err
	}
	if len(h.Distributed) > 0 || len(h.StorageRaw) > 0 {
		h.logger.Warn("the distributed and storage options of mholt/caddy-ratelimit are accepted but not used; set `store redis` on a zone to share its limit between instances")
	}
	h.headers, _ = parseHeaderMode(h.Headers)

	names := make([]string, 0, len(h.RateLimits))
	for name := range h.RateLimits {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		z, err := h.provisionZone(ctx, name, h.RateLimits[name])
		if err != nil {
			h.releaseZones()
			return fmt.Errorf("zone %q: %w", name, err)
		}
		h.zones = append(h.zones, z)
	}

	interval := time.Duration(h.SweepInterval)
	if interval <= 0 {
		interval = time.Minute
	}
	h.sweeper = startSweeper(interval, h.zones)
	return nil
}

// Validate refuses configurations that cannot be enforced as written.
func (h *Handler) Validate() error {
	if _, err := parseHeaderMode(h.Headers); err != nil {
		return err
	}
	if h.Jitter < 0 {
		return fmt.Errorf("jitter must not be negative, got %v", h.Jitter)
	}
	if h.MaxKeys < 0 {
		return fmt.Errorf("max_keys must not be negative, got %d", h.MaxKeys)
	}
	if h.SweepInterval < 0 {
		return fmt.Errorf("sweep_interval must not be negative")
	}
	if len(h.RateLimits) == 0 {
		return fmt.Errorf("at least one zone is required")
	}
	for name, z := range h.RateLimits {
		if z == nil {
			return fmt.Errorf("zone %q: empty", name)
		}
		if err := z.validate(name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
	}
	return nil
}

// Cleanup stops the sweeper and releases the zones' stores.
func (h *Handler) Cleanup() error {
	h.sweeper.stop()
	h.releaseZones()
	return nil
}

func (h *Handler) releaseZones() {
	for _, z := range h.zones {
		z.release()
	}
	h.zones = nil
}

// ServeHTTP evaluates every zone that matches r, refuses r if any zone
// denies it, and otherwise holds it for any leaky bucket and passes it on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ev := getEvaluation()
	defer putEvaluation(ev)
	if err := h.evaluate(r, ev); err != nil {
		ev.refund(r)
		return err
	}
	if len(ev.outcomes) == 0 {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	now := time.Now()
	if ev.denied >= 0 {
		ev.refund(r)
		return h.deny(w, r, repl, ev, now)
	}
	h.writeHeaders(w.Header(), ev, now, 0)
	setPlaceholders(repl, ev, 0)
	if ev.hold > 0 {
		if err := holdRequest(r, ev.hold); err != nil {
			ev.release(r)
			return err
		}
	}
	err := next.ServeHTTP(w, r)
	ev.release(r)
	return err
}

// Interface guards
var (
	_ caddy.Module                = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ limiter.Store               = (*limiter.Memory)(nil)
)

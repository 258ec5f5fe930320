package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// RedisConfig is the `redis` block: where zones with `store redis` keep
// their state, so every instance pointed at the same Redis enforces one
// shared limit. Values may hold placeholders such as {env.REDIS_URL}; they
// are resolved when the config loads.
type RedisConfig struct {
	// URL is redis://[user:pass@]host[:port][/db], or rediss:// for TLS.
	URL string `json:"url,omitempty"`
	// Addresses are host:port pairs: one is a standalone server, several
	// are Cluster seeds, or Sentinels when master_name is set.
	Addresses []string `json:"addresses,omitempty"`
	// MasterName selects Sentinel: the name the Sentinels monitor.
	MasterName string `json:"master_name,omitempty"`
	// Shards are host:port pairs of standalone servers over which keys
	// are spread by consistent hashing, instead of url or addresses.
	// Every instance must list the same shards (in any order, each
	// written the same way): a shard that fails applies the fail mode to
	// its own keys only, and its keys start afresh when it returns.
	Shards []string `json:"shards,omitempty"`
	// Username and Password authenticate to Redis.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// when they require it; Username and Password stay the data nodes'.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// DB selects the database (not on Cluster).
	DB int `json:"db,omitempty"`
	// TLS connects with TLS.
	TLS bool `json:"tls,omitempty"`
	// InsecureSkipVerify accepts any server certificate; for testing only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// TLSCA is a PEM file of the CAs that sign the server's certificate,
	// trusted instead of the system's (the tls block's ca). It and the
	// other tls_ fields need tls or a rediss:// url.
	TLSCA string `json:"tls_ca,omitempty"`
	// TLSCert and TLSKey are a client certificate and its private key,
	// PEM files, for a server that requires one (the tls block's cert and
	// key); one without the other is refused. The files are read when
	// the config loads: a reload after replacing them connects anew.
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	// TLSServerName is the name the server's certificate must carry, when
	// it is not the host connected to (the tls block's server_name).
	TLSServerName string `json:"tls_server_name,omitempty"`
	// Timeout bounds each decision; past it the zone's fail mode applies.
	// Default: 5ms; at least 1ms, as every duration of the block.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// DialTimeout bounds connecting to a server, apart from Timeout: a
	// connection opened for a decision still counts against the
	// decision's timeout, but the warm start when a config loads, which
	// connects before the config serves, waits up to this long (within
	// its 1s budget). Default: 1s, or a url's dial_timeout query option.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// BreakerAfter is how long every decision on the block's servers must
	// fail before the breaker opens: requests are then answered by their
	// zone's fail mode at once instead of each waiting for the timeout.
	// Default: 100ms.
	BreakerAfter caddy.Duration `json:"breaker_after,omitempty"`
	// BreakerOpenFor is how long the breaker stays open before decisions
	// go to Redis again; one more failure then opens it for as long again.
	// Default: 250ms.
	BreakerOpenFor caddy.Duration `json:"breaker_open_for,omitempty"`
	// PoolSize bounds connections per node. Default: go-redis's, 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`
	// KeyPrefix starts every key Floodgate writes. Default: "floodgate:".
	KeyPrefix string `json:"key_prefix,omitempty"`
	// OverridesRefresh is how often each instance checks its redis zones'
	// runtime overrides against Redis, catching up a change whose message
	// it missed. Default: 60s; at least 100ms.
	OverridesRefresh caddy.Duration `json:"overrides_refresh,omitempty"`

	// Global makes every redis zone of the handler one limit across
	// regions: the server above (url, addresses...) is this region's,
	// which keeps the region's pool of units, and Global is the server
	// that holds each key's true count, which a region asks only when its
	// pool runs short. Only fixed_window (calendar included),
	// sliding_window_log, sliding_window_counter and token_bucket zones.
	Global *GlobalRedisConfig `json:"global,omitempty"`
}

// validate refuses a block that names no server or contradicts itself
// (redisstore.Config.Validate, the one check of the client's fields,
// run on the block as written: resolving its placeholders changes none
// of what it checks), and a timing or size outside its bound (bounds.go).
// Its messages do not say "redis": the caller does.
func (c *RedisConfig) validate() error {
	if err := c.clientConfig(func(s string) string { return s }).Validate(); err != nil {
		return err
	}
	if c.Global != nil {
		if err := c.Global.validate(); err != nil {
			return fmt.Errorf("global: %w", err)
		}
	}
	if err := poolSizeBound.check(c.PoolSize); err != nil {
		return err
	}
	for _, d := range []struct {
		v     caddy.Duration
		bound durationBound
	}{
		{c.Timeout, timeoutBound},
		{c.DialTimeout, dialTimeoutBound},
		{c.BreakerAfter, breakerAfterBound},
		{c.BreakerOpenFor, breakerOpenForBound},
		{c.OverridesRefresh, overridesRefreshBound},
	} {
		if err := d.bound.check(d.v); err != nil {
			return err
		}
	}
	return nil
}

// defaultDialTimeout bounds connecting when neither dial_timeout nor the
// url says: long enough for a server across a network, short enough that
// the warm start of a config with an unreachable Redis stays within its
// budget (see warmRedis).
const defaultDialTimeout = time.Second

// redisPoolKey is what identifies a shared client: its settings and its
// breaker's, so a reload that changes either gets a client of its own.
type redisPoolKey struct {
	Client  redisstore.Config
	Breaker redisstore.BreakerOptions
	// TLSFiles stands for what the tls block's files hold, so a reload
	// after a certificate is renewed in place gets a client that
	// presents the new one.
	TLSFiles string
}

// poolKey is c with placeholders replaced, in the limiter's terms.
func (c *RedisConfig) poolKey() redisPoolKey {
	client := c.resolved()
	return redisPoolKey{
		Client:   client,
		Breaker:  redisstore.BreakerOptions{After: time.Duration(c.BreakerAfter), OpenFor: time.Duration(c.BreakerOpenFor)},
		TLSFiles: filesDigest(client.TLSOptions.CAFile, client.TLSOptions.CertFile, client.TLSOptions.KeyFile),
	}
}

// filesDigest is a SHA-256 of the named files' contents ("" names none),
// or of why one cannot be read, which NewClient then reports: it keeps no
// secret, only tells one content from another.
func filesDigest(paths ...string) string {
	h := sha256.New()
	for _, p := range paths {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			b = []byte(err.Error())
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkResolved refuses a block whose placeholders resolve to nothing: a
// password, username, url, address or name written as {env.X} with X
// unset would otherwise connect without credentials, or nowhere, as the
// jwt block's secret is refused (see JWTConfig.newVerifier).
// Placeholders Caddy does not know are kept as written, as resolved keeps
// them: a password may hold braces.
func (c *RedisConfig) checkResolved() error {
	repl := caddy.NewReplacer()
	fields := []struct{ name, value string }{
		{"url", c.URL}, {"master_name", c.MasterName},
		{"username", c.Username}, {"password", c.Password},
		{"sentinel_username", c.SentinelUsername}, {"sentinel_password", c.SentinelPassword},
		{"tls ca", c.TLSCA}, {"tls cert", c.TLSCert}, {"tls key", c.TLSKey}, {"tls server_name", c.TLSServerName},
	}
	for _, a := range c.Addresses {
		fields = append(fields, struct{ name, value string }{"addresses", a})
	}
	for _, a := range c.Shards {
		fields = append(fields, struct{ name, value string }{"shards", a})
	}
	for _, f := range fields {
		if f.value == "" {
			continue
		}
		v, err := repl.ReplaceOrErr(f.value, true, false)
		if err == nil && v == "" {
			err = errors.New("resolves to nothing")
		}
		if err != nil {
			return fmt.Errorf("%s %q is empty when resolved (an unset environment variable?): %w", f.name, redactSecret(f.name, f.value), err)
		}
	}
	if c.Global != nil {
		if err := c.Global.checkResolved(); err != nil {
			return fmt.Errorf("global: %w", err)
		}
	}
	return nil
}

// redactSecret is value, a field of the redis block, as an error may show
// it: a password's literal parts are replaced by "***" (its placeholders
// are kept, since they name what to set), and a URL's or address's
// userinfo password likewise, so an error, its log line and the admin
// API's answer to a refused /load never carry a secret.
func redactSecret(name, value string) string {
	switch name {
	case "password", "sentinel_password":
		return redactLiterals(value)
	case "url", "addresses", "shards":
		return redactUserinfo(value)
	}
	return value
}

// redactLiterals keeps s's placeholders ({...}) and replaces each run of
// anything else by "***".
func redactLiterals(s string) string {
	var b strings.Builder
	for s != "" {
		open := strings.IndexByte(s, '{')
		end := -1
		if open >= 0 {
			end = strings.IndexByte(s[open:], '}')
		}
		if end < 0 {
			b.WriteString("***")
			break
		}
		if open > 0 {
			b.WriteString("***")
		}
		b.WriteString(s[open : open+end+1])
		s = s[open+end+1:]
	}
	return b.String()
}

// redactUserinfo replaces the password of a URL's userinfo
// (scheme://user:password@host) by "***". It works on text rather than
// url.Parse, which refuses the placeholders an unresolved URL holds.
func redactUserinfo(s string) string {
	scheme := strings.Index(s, "://")
	if scheme < 0 {
		return s
	}
	rest := s[scheme+3:]
	host := len(rest)
	if slash := strings.IndexByte(rest, '/'); slash >= 0 {
		host = slash
	}
	at := strings.LastIndexByte(rest[:host], '@')
	if at < 0 {
		return s
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return s
	}
	return s[:scheme+3] + user + ":***" + rest[at:]
}

// resolved is c's client settings with placeholders replaced, in the
// limiter's terms, and the default dial timeout applied.
func (c *RedisConfig) resolved() redisstore.Config {
	repl := caddy.NewReplacer()
	r := c.clientConfig(func(s string) string { return repl.ReplaceKnown(s, "") })
	if r.DialTimeout == 0 && !urlSetsDialTimeout(r.URL) {
		r.DialTimeout = defaultDialTimeout
	}
	return r
}

// clientConfig is c's client settings in the limiter's terms, each text
// passed through replace.
func (c *RedisConfig) clientConfig(replace func(string) string) redisstore.Config {
	r := redisstore.Config{
		URL:                replace(c.URL),
		MasterName:         replace(c.MasterName),
		Username:           replace(c.Username),
		Password:           replace(c.Password),
		SentinelUsername:   replace(c.SentinelUsername),
		SentinelPassword:   replace(c.SentinelPassword),
		DB:                 c.DB,
		TLS:                c.TLS,
		InsecureSkipVerify: c.InsecureSkipVerify,
		TLSOptions: redisstore.TLS{
			CAFile:     replace(c.TLSCA),
			CertFile:   replace(c.TLSCert),
			KeyFile:    replace(c.TLSKey),
			ServerName: replace(c.TLSServerName),
		},
		PoolSize:    c.PoolSize,
		DialTimeout: time.Duration(c.DialTimeout),
	}
	for _, a := range c.Addresses {
		r.Addresses = append(r.Addresses, replace(a))
	}
	for _, a := range c.Shards {
		r.Shards = append(r.Shards, replace(a))
	}
	return r
}

// urlSetsDialTimeout reports whether raw carries go-redis's dial_timeout
// query option, which the default must not override.
func urlSetsDialTimeout(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Query().Has("dial_timeout")
}

// UnmarshalCaddyfile parses the `redis` block; the dispenser is on `redis`.
func (c *RedisConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	opts := c.options("redis")
	opts["global"] = option{args: blockArgs, parse: func(d *caddyfile.Dispenser) error {
		c.Global = new(GlobalRedisConfig)
		return c.Global.parse(d)
	}}
	return parseOptionBlock(d, "redis", opts, c.validate)
}

// options is the option table of a block of server settings (the redis
// block, or its global block), each option filling its field of c; block
// names it in the refusals of its nested tls block.
func (c *RedisConfig) options(block string) map[string]option {
	return map[string]option{
		"url": {args: "<url>", parse: func(d *caddyfile.Dispenser) error {
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			// A url with a placeholder is parsed once it is resolved.
			if !strings.Contains(v, "{") {
				if err := redisstore.CheckURL(v); err != nil {
					return err
				}
			}
			c.URL = v
			return nil
		}},
		"addresses": {args: "<host:port>...", parse: func(d *caddyfile.Dispenser) error {
			if c.Addresses = d.RemainingArgs(); len(c.Addresses) == 0 {
				return errArgCount
			}
			return nil
		}},
		"shards": {args: "<host:port>...", parse: func(d *caddyfile.Dispenser) error {
			if c.Shards = d.RemainingArgs(); len(c.Shards) == 0 {
				return errArgCount
			}
			return nil
		}},
		"master_name":       stringOption("<name>", &c.MasterName),
		"username":          stringOption("<username>", &c.Username),
		"password":          stringOption("<password>", &c.Password),
		"sentinel_username": stringOption("<username>", &c.SentinelUsername),
		"sentinel_password": stringOption("<password>", &c.SentinelPassword),
		"db":                intOption(&c.DB, dbBound),
		"tls": {args: "[insecure_skip_verify] [{ ... }]", parse: func(d *caddyfile.Dispenser) error {
			return c.parseTLS(d, block)
		}},
		"timeout":           durationOption(&c.Timeout, timeoutBound),
		"dial_timeout":      durationOption(&c.DialTimeout, dialTimeoutBound),
		"breaker_after":     durationOption(&c.BreakerAfter, breakerAfterBound),
		"breaker_open_for":  durationOption(&c.BreakerOpenFor, breakerOpenForBound),
		"pool_size":         intOption(&c.PoolSize, poolSizeBound),
		"key_prefix":        stringOption("<prefix>", &c.KeyPrefix),
		"overrides_refresh": durationOption(&c.OverridesRefresh, overridesRefreshBound),
	}
}

// parseTLS reads `tls [insecure_skip_verify]` and its optional block,
// `tls { ca <PEM file>; cert <PEM file>; key <PEM file>; server_name
// <name>; insecure_skip_verify }`, and checks the block when it closes,
// at the tls line. The files are read when the config loads (Provision),
// so a Caddyfile can be adapted where they do not exist.
func (c *RedisConfig) parseTLS(d *caddyfile.Dispenser, parent string) error {
	line := d.Line()
	c.TLS = true
	switch args := d.RemainingArgs(); {
	case len(args) == 0:
	case len(args) == 1 && args[0] == "insecure_skip_verify":
		c.InsecureSkipVerify = true
	default:
		return errArgCount
	}
	block := parent + ": tls"
	err := parseBlock(d, block, map[string]option{
		"ca":                   stringOption("<PEM file>", &c.TLSCA),
		"cert":                 stringOption("<PEM file>", &c.TLSCert),
		"key":                  stringOption("<PEM file>", &c.TLSKey),
		"server_name":          stringOption("<name>", &c.TLSServerName),
		"insecure_skip_verify": flagOption(&c.InsecureSkipVerify),
	})
	if err != nil {
		return err
	}
	if err := c.clientConfig(func(s string) string { return s }).ValidateTLS(); err != nil {
		return refuseAt(d, line, "%s: %v", block, err)
	}
	return nil
}

// Interface guard: the redis block is parsed by the handler's parser.
var _ caddyfile.Unmarshaler = (*RedisConfig)(nil)

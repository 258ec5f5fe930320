package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config is how an operator points the Redis store at a server: the
// fields of the Caddyfile's redis block, turned into a go-redis client by
// NewClient, so the adapter and tests build clients the same way.
type Config struct {
	// URL is redis://[user:pass@]host[:port][/db] or rediss:// for TLS,
	// with go-redis's query options (dial_timeout, pool_size, ...). It names
	// one standalone server; use Addresses for Cluster or Sentinel.
	URL string
	// Addresses are host:port pairs: one is a standalone server, several
	// are Cluster seeds, or Sentinels when MasterName is set.
	Addresses []string
	// MasterName selects Sentinel: the name the Sentinels monitor the
	// master under.
	MasterName string
	// Shards are host:port pairs of standalone servers over which keys
	// are spread by consistent hashing (a go-redis Ring; see
	// shards.go), instead of URL or Addresses. Every instance must
	// list the same shards, in any order: a shard is named by its address.
	Shards []string
	// Username and Password authenticate to the data nodes; when set they
	// override the URL's.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves, when they require it (requirepass in sentinel.conf),
	// which is separate from the data nodes' credentials.
	SentinelUsername, SentinelPassword string
	// DB selects a database on a standalone or Sentinel master; Cluster
	// has only database 0. When non-zero it overrides the URL's.
	DB int
	// TLS connects with TLS, as a rediss:// URL does.
	TLS bool
	// InsecureSkipVerify accepts any server certificate; for testing only.
	InsecureSkipVerify bool
	// TLSOptions are the CAs, client certificate and server name of a TLS
	// connection (TLS or a rediss:// URL), for the data nodes and, with
	// MasterName, the Sentinels alike: go-redis dials both with one
	// tls.Config.
	TLSOptions TLS
	// PoolSize bounds the connections per node; zero is go-redis's default
	// of ten per CPU.
	PoolSize int
	// DialTimeout bounds connecting; zero is go-redis's default of 5s.
	DialTimeout time.Duration
}

// MaxDB is the largest database number a Config accepts, far
// above Redis's default of 16 databases: a larger one is a typo.
const MaxDB = 1 << 16

// Validate refuses a config that names no server, or contradicts itself:
// it is the one check of these fields, which the adapter runs on its
// redis block (placeholders and all) to report them when a config loads,
// and NewClient runs again on the values it connects with. Its messages
// name the fields as the redis block spells them. It parses no URL, which
// may still hold a placeholder: NewClient parses it, and refuses there
// what only the parsed URL tells (its scheme, insecure_skip_verify
// without TLS).
func (c Config) Validate() error {
	switch {
	case c.URL == "" && len(c.Addresses) == 0 && len(c.Shards) == 0:
		return errors.New("url, addresses or shards is required")
	case c.URL != "" && len(c.Addresses) > 0:
		return errors.New("url and addresses cannot both be set")
	case len(c.Shards) > 0 && (c.URL != "" || len(c.Addresses) > 0 || c.MasterName != ""):
		return errors.New("shards cannot be set with url, addresses or master_name: shards are standalone servers, named in shards alone")
	case c.MasterName != "" && len(c.Addresses) == 0:
		return errors.New("master_name needs the Sentinels in addresses, not a url")
	case (c.SentinelUsername != "" || c.SentinelPassword != "") && c.MasterName == "":
		return errors.New("sentinel_username and sentinel_password need master_name")
	case c.DB < 0 || c.DB > MaxDB:
		return fmt.Errorf("db must be from 0 to %d, got %d", MaxDB, c.DB)
	case c.DB != 0 && c.MasterName == "" && len(c.Addresses) > 1:
		return fmt.Errorf("db %d: Redis Cluster has only database 0", c.DB)
	case c.PoolSize < 0:
		return fmt.Errorf("pool_size must not be negative, got %d", c.PoolSize)
	case c.DialTimeout < 0:
		return fmt.Errorf("dial_timeout must not be negative, got %v", c.DialTimeout)
	}
	if err := c.ValidateTLS(); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	for _, a := range c.Addresses {
		if a == "" {
			return errors.New("addresses holds an empty address")
		}
	}
	return checkShards(c.Shards)
}

// NewClient returns a client for c: standalone for a URL or one address,
// Cluster for several, Sentinel (a failover client) when MasterName is set,
// a Ring over the standalone servers of Shards (see newRing).
// The client honours context deadlines, which the Redis store's
// per-decision timeout depends on. It connects lazily: an unreachable server
// shows as errors from the store, to which the zone's fail mode applies.
func (c Config) NewClient() (redis.UniversalClient, error) {
	opts, err := c.options()
	if err != nil {
		return nil, fmt.Errorf("redis config: %w", err)
	}
	if len(c.Shards) > 0 {
		return newRing(opts), nil
	}
	return redis.NewUniversalClient(opts), nil
}

// options maps c, once Validate accepts it, onto go-redis's options.
func (c Config) options() (*redis.UniversalOptions, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts *redis.UniversalOptions
	if c.URL != "" {
		var err error
		if opts, err = fromURL(c.URL); err != nil {
			return nil, err
		}
	} else if len(c.Shards) > 0 {
		opts = &redis.UniversalOptions{Addrs: append([]string(nil), c.Shards...)}
	} else {
		opts = &redis.UniversalOptions{Addrs: append([]string(nil), c.Addresses...), MasterName: c.MasterName}
	}
	opts.SentinelUsername, opts.SentinelPassword = c.SentinelUsername, c.SentinelPassword
	if c.Username != "" {
		opts.Username = c.Username
	}
	if c.Password != "" {
		opts.Password = c.Password
	}
	if c.DB != 0 {
		opts.DB = c.DB
	}
	if c.PoolSize != 0 {
		opts.PoolSize = c.PoolSize
	}
	if c.DialTimeout != 0 {
		opts.DialTimeout = c.DialTimeout
	}
	if c.TLS && opts.TLSConfig == nil {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.InsecureSkipVerify {
		// Checked here, not in Validate: whether a url is rediss:// is
		// known only once its placeholders are resolved.
		if opts.TLSConfig == nil {
			return nil, errors.New("insecure_skip_verify needs tls or a rediss:// url")
		}
		opts.TLSConfig.InsecureSkipVerify = true
	}
	if c.TLSOptions.set() {
		if opts.TLSConfig == nil {
			return nil, errors.New("the tls block's ca, cert, key and server_name (JSON tls_ca, tls_cert, tls_key, tls_server_name) need tls or a rediss:// url")
		}
		if err := c.TLSOptions.apply(opts.TLSConfig); err != nil {
			return nil, err
		}
	}
	opts.ContextTimeoutEnabled = true
	// No CLIENT SETINFO on connect: Redis 7.0 does not know the command,
	// so the ACL rule of docs/redis.md cannot grant it there, and a server that
	// knows it (7.2 and later, Valkey) would log a denial to ACL LOG for
	// every connection of a user without it.
	opts.DisableIdentity = true
	// The store's pipelines hold at most redisMaxPipeline scripts, about 13 KiB
	// out and 3 KiB back: go-redis's 128 KiB pipeline buffers would only
	// hold memory.
	opts.PipelineReadBufferSize = 32 << 10
	opts.PipelineWriteBufferSize = 32 << 10
	// One dial per attempt: go-redis otherwise redials a refused or
	// unreachable server 5 times 100ms apart, which hides a dead Redis from
	// the zone until most of its timeout has passed, so every request
	// waits that long before the fail mode applies.
	opts.DialerRetries = 1
	// No command retries: a script whose reply was lost may already have
	// taken its units, and running it again would count one request twice.
	// A failed decision goes to the zone's fail mode instead. (A Cluster
	// client still follows MOVED/ASK redirects, which mean the script did
	// not run.)
	opts.MaxRetries = -1
	return opts, nil
}

// CheckURL refuses a url NewClient could not parse, saying why
// without repeating it (it may hold a password), so a config can be
// refused at the url's line before any client exists.
func CheckURL(raw string) error {
	_, err := fromURL(raw)
	return err
}

// fromURL parses a redis:// or rediss:// URL with go-redis and keeps the
// options a standalone client uses.
func fromURL(raw string) (*redis.UniversalOptions, error) {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("url scheme %q: want redis:// or rediss://", u.Scheme)
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		// The URL may hold a password: say what is wrong, not what it was.
		return nil, fmt.Errorf("parsing url: %w", redactURLError(err))
	}
	return &redis.UniversalOptions{
		Addrs:           []string{o.Addr},
		ClientName:      o.ClientName,
		Protocol:        o.Protocol,
		Username:        o.Username,
		Password:        o.Password,
		DB:              o.DB,
		MaxRetries:      o.MaxRetries,
		MinRetryBackoff: o.MinRetryBackoff,
		MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout:     o.DialTimeout,
		ReadTimeout:     o.ReadTimeout,
		WriteTimeout:    o.WriteTimeout,
		PoolFIFO:        o.PoolFIFO,
		PoolSize:        o.PoolSize,
		PoolTimeout:     o.PoolTimeout,
		MinIdleConns:    o.MinIdleConns,
		MaxIdleConns:    o.MaxIdleConns,
		MaxActiveConns:  o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime,
		ConnMaxLifetime: o.ConnMaxLifetime,
		TLSConfig:       o.TLSConfig,
	}, nil
}

// redactURLError drops the URL that net/url quotes in its errors.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

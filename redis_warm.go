package ratelimit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// warmBudget bounds the warm start of a config's Redis stores in total,
// so an unreachable Redis delays a start or a reload by at most this long.
const warmBudget = time.Second

// warmRedis connects the handler's Redis client and loads the scripts of
// every Redis store of its zones before the config serves, so the first
// decision after a start or a reload is an ordinary one rather than one
// that also dials and meets NOSCRIPT and so runs past a tight timeout. A
// failure is logged once and otherwise ignored: the other stores are
// still warmed (a shard or a master that is down leaves the others
// ready), decisions dial and load scripts themselves, and the zones' fail
// modes apply as ever. A failure that is the redis block's configuration
// (a wrong password, none where one is required, a Cluster node given as
// a standalone server) is logged as an error naming the fix, since waiting
// will not mend it, and ends the warm-up. A TLS connection the server
// reset names no cause; redisstore.ProbeTLSRefusal asks the server for it.
func (h *Handler) warmRedis() {
	var targets []warmTarget
	for _, z := range h.zones {
		for _, l := range z.limits() {
			switch {
			case l.region != nil:
				targets = append(targets,
					warmTarget{l.region.pool.Preload, h.redis.UniversalClient},
					warmTarget{l.region.global.Preload, h.global.UniversalClient})
			case l.redis != nil:
				targets = append(targets, warmTarget{l.redis.Preload, h.redis.UniversalClient})
			}
		}
	}
	if len(targets) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmBudget)
	defer cancel()
	var failed error
	for _, tg := range targets {
		err := tg.preload(ctx)
		if err == nil {
			continue
		}
		if fix := redisConfigFix(err); fix != "" {
			h.logger.Error(fix, zap.Error(err))
			return
		}
		if alert := redisstore.ProbeTLSRefusal(ctx, tg.client, err); alert != nil {
			if fix := tlsConfigFix(alert); fix != "" {
				h.logger.Error(fix, zap.Error(err), zap.NamedError("server_alert", alert))
				return
			}
		}
		if failed == nil {
			failed = err
		}
	}
	if failed != nil {
		h.logger.Warn("could not warm up Redis before serving: the first decisions may be slow or follow the zones' fail modes",
			zap.Duration("budget", warmBudget), zap.Error(failed))
	}
	h.checkNotClusterNode(ctx)
}

// warmTarget is what the warm start preloads: a store's or a regional
// pool's scripts, and the client they go through.
type warmTarget struct {
	preload func(context.Context) error
	client  redis.UniversalClient
}

// redisConfigFix names the fix for an error reply by which Redis refuses
// the redis block's configuration, or is "" for any other error. The
// decisions that meet these errors fail like any other (fail mode,
// breaker); this is for the one line at provisioning that says why.
func redisConfigFix(err error) string {
	if fix := tlsConfigFix(err); fix != "" {
		return fix
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return ""
	}
	msg := re.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"):
		return "redis rejected the password: check the redis block's password/username (or the url's credentials)"
	case strings.HasPrefix(msg, "NOAUTH"):
		return "redis requires a password and none was given: set the redis block's password (and username), or credentials in its url"
	case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "can't run this command or subcommand script"), strings.Contains(msg, "ACL failure in script"):
		return "the redis user may not run a command Floodgate needs (the error names it): give its ACL user the rule in docs/redis.md, \"Redis ACL\", on the key_prefix's keys"
	case strings.HasPrefix(msg, "MOVED"):
		return clusterNodeFix
	}
	return ""
}

// clusterNodeFix is the fix for a standalone client pointed at a Cluster
// node, which answers MOVED for the keys of every other node's hash slots.
const clusterNodeFix = "the redis block's single address is a Redis Cluster node: a standalone client gets MOVED for the keys of other nodes' hash slots; list several of the Cluster's nodes in addresses, so Floodgate uses a Cluster client"

// shardClusterNodeFix is clusterNodeFix for a shard of the redis block's
// shards, which must be standalone servers.
const shardClusterNodeFix = "a server in the redis block's shards is a Redis Cluster node: shards must be standalone servers, and a Cluster node answers MOVED for the keys of other nodes' hash slots; for a Cluster, list its nodes in addresses instead of shards"

// checkNotClusterNode logs clusterNodeFix when the handler's client is a
// standalone one (one address, or a url) and its server has Cluster mode
// on, and shardClusterNodeFix for each shard that has. Loading scripts
// names no key, so a Cluster node accepts it; only decisions would meet
// MOVED. The probe is best effort: an error (an ACL user without INFO,
// say) says nothing.
func (h *Handler) checkNotClusterNode(ctx context.Context) {
	var clients []*redis.Client
	fix := clusterNodeFix
	switch c := h.redis.UniversalClient.(type) {
	case *redis.Client:
		clients = []*redis.Client{c}
	case *redis.Ring:
		clients, fix = c.GetShardClients(), shardClusterNodeFix
	}
	for _, c := range clients {
		info, err := c.Info(ctx, "cluster").Result()
		if err == nil && strings.Contains(info, "cluster_enabled:1") {
			h.logger.Error(fix, zap.String("address", c.Options().Addr))
		}
	}
}

// tlsConfigFix names the fix for a TLS handshake that failed because of
// the tls block or the certificates it names, or is "" for any other
// error. Floodgate's side of the handshake fails with x509's errors; the
// server's refusal of the client certificate arrives as a TLS alert,
// which crypto/tls reports only as text ("remote error: tls: ...").
func tlsConfigFix(err error) string {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		var unknown x509.UnknownAuthorityError
		var host x509.HostnameError
		var invalid x509.CertificateInvalidError
		switch {
		case errors.As(verify.Err, &unknown):
			return "the redis server's certificate is not signed by the tls block's ca (without ca: by a CA this system trusts): set ca to the PEM file of the CA that signed it"
		case errors.As(verify.Err, &host):
			return "the redis server's certificate is not for the name Floodgate connects to: connect by a name it carries, or set the tls block's server_name to one"
		case errors.As(verify.Err, &invalid) && invalid.Reason == x509.Expired:
			return "the redis server's certificate has expired or is not valid yet: renew it on the server (or check this machine's clock)"
		}
		return "the redis server's certificate does not verify: check the tls block's ca and server_name"
	}
	var record tls.RecordHeaderError
	if errors.As(err, &record) {
		return "the redis server does not speak TLS on this port: remove tls (or use redis://), or connect to its tls-port"
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "remote error: tls: certificate required"):
		return "the redis server requires a client certificate: set the tls block's cert and key"
	case strings.Contains(msg, "remote error: tls: expired certificate"):
		return "the redis server refused the client certificate as expired (or not valid yet): renew the file the tls block's cert names"
	case strings.Contains(msg, "remote error: tls: unknown certificate authority"),
		strings.Contains(msg, "remote error: tls: bad certificate"),
		strings.Contains(msg, "remote error: tls: unsupported certificate"):
		return "the redis server does not accept the client certificate: the tls block's cert must be signed by a CA in the server's tls-ca-cert-file and allowed for client authentication"
	}
	return ""
}

package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// tlsProbeWait bounds how long ProbeTLSRefusal waits for a server's verdict
// on a handshake that looked complete: a server that refuses the client's
// certificate sends its alert as soon as it reads the client's last
// handshake message, so a server that has said nothing by then accepted.
const tlsProbeWait = 500 * time.Millisecond

// ProbeTLSRefusal asks the Redis server whose connection failed with err
// why it refused the TLS handshake, when the client cannot have learnt it.
// Under TLS 1.3 a server that requires a client certificate judges the
// client's only after the client has finished its side of the handshake
// and written its first command; the server then sends an alert naming
// the cause and closes, and with that command still unread its close is a
// reset, which can reach the client before the alert: the command fails
// with "connection reset by peer" (or a broken pipe, or EOF), which names
// nothing. The probe dials the server err names, by the name the client
// connects by (failedAddrs), with the client's TLS config, and writes
// nothing, so the server's close carries the alert, and
// returns the error that reading it meets ("remote error: tls: ..."). It
// returns nil when err is not such a failure, the client does not use
// TLS, or the server sent no alert within the wait: the cause is then not
// the handshake. It is for the one diagnosis at provisioning, never on the
// request path.
func ProbeTLSRefusal(ctx context.Context, client redis.UniversalClient, err error) error {
	if !refusedAfterHandshake(err) {
		return nil
	}
	cfg := clientTLS(client)
	if cfg == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, tlsProbeWait)
	defer cancel()
	// At once: a server that accepts sends nothing, and its read would
	// hold the wait from the others.
	addrs := failedAddrs(ctx, client, err)
	alerts := make(chan error, len(addrs))
	for _, addr := range addrs {
		go func() { alerts <- probeAlert(ctx, cfg, addr) }()
	}
	for range addrs {
		if alert := <-alerts; alert != nil {
			return alert
		}
	}
	return nil
}

// probeAlert dials addr with cfg, writes nothing, and returns the TLS
// alert the server sends within ctx, or nil.
func probeAlert(ctx context.Context, cfg *tls.Config, addr string) error {
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return alertOrNil(err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil
	}
	_, err = conn.Read(make([]byte, 1))
	return alertOrNil(err)
}

// refusedAfterHandshake reports whether err is how a connection ends when
// the server closed it under the client's feet: a reset, a broken pipe or
// EOF.
func refusedAfterHandshake(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF)
}

// failedAddrs are the addresses the client dials for the server that err
// names: by the name the client connects by, as go-redis dials it, so the
// probe verifies the server's certificate by that name rather than by
// the IP the connection resolved to, which a certificate for a host name
// alone does not carry. A standalone client's address, the shard whose
// address resolves to the one err names, or (a Cluster's nodes and a
// Sentinel's master, which go-redis dials by the address they announce)
// err's own. An error that names none (EOF) is a standalone client's
// server, or any of a Ring's shards.
func failedAddrs(ctx context.Context, client redis.UniversalClient, err error) []string {
	var named string
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		named = op.Addr.String()
	}
	switch c := client.(type) {
	case *redis.Client:
		// A Sentinel client's Addr is no address: its master is.
		if _, _, splitErr := net.SplitHostPort(c.Options().Addr); splitErr == nil {
			return []string{c.Options().Addr}
		}
	case *redis.Ring:
		var all []string
		for _, shard := range c.GetShardClients() {
			addr := shard.Options().Addr
			if named != "" && resolvesTo(ctx, addr, named) {
				return []string{addr}
			}
			all = append(all, addr)
		}
		if named == "" {
			return all
		}
	}
	if named == "" {
		return nil
	}
	return []string{named}
}

// resolvesTo reports whether addr (host:port) is ip (ip:port) by name.
func resolvesTo(ctx context.Context, addr, ip string) bool {
	if addr == ip {
		return true
	}
	host, port, err := net.SplitHostPort(addr)
	wantIP, wantPort, err2 := net.SplitHostPort(ip)
	if err != nil || err2 != nil || port != wantPort {
		return false
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	return err == nil && slices.Contains(ips, wantIP)
}

// alertOrNil is err when it is a TLS alert from the server, which
// crypto/tls reports only as text, and nil otherwise.
func alertOrNil(err error) error {
	if err != nil && strings.Contains(err.Error(), "remote error: tls: ") {
		return err
	}
	return nil
}

// clientTLS is the TLS config client dials with, or nil without TLS.
func clientTLS(client redis.UniversalClient) *tls.Config {
	var cfg *tls.Config
	switch c := client.(type) {
	case *redis.Client:
		cfg = c.Options().TLSConfig
	case *redis.ClusterClient:
		cfg = c.Options().TLSConfig
	case *redis.Ring:
		if shards := c.GetShardClients(); len(shards) > 0 {
			cfg = shards[0].Options().TLSConfig
		}
	}
	if cfg == nil {
		return nil
	}
	return cfg.Clone()
}

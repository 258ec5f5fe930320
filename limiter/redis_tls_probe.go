package limiter

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
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
// nothing. The probe dials the address err names with client's TLS config
// and writes nothing, so the server's close carries the alert, and
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
	addr := failedAddr(client, err)
	if cfg == nil || addr == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, tlsProbeWait)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	conn, dialErr := d.DialContext(ctx, "tcp", addr)
	if dialErr != nil {
		return alertOrNil(dialErr)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil
	}
	_, readErr := conn.Read(make([]byte, 1))
	return alertOrNil(readErr)
}

// refusedAfterHandshake reports whether err is how a connection ends when
// the server closed it under the client's feet: a reset, a broken pipe or
// EOF.
func refusedAfterHandshake(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF)
}

// failedAddr is the server address err names, or for an error that
// names none (EOF) the address of a client of one server.
func failedAddr(client redis.UniversalClient, err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		return op.Addr.String()
	}
	if c, ok := client.(*redis.Client); ok {
		return c.Options().Addr
	}
	return ""
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

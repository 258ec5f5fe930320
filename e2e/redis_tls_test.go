package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// tlsRedisSite is a site with one redis zone, "tls" at /tls, of 5
// requests an hour per X-Client, failing as fail says, on the Redis at
// addrs (one: a standalone server; several: a Cluster) over TLS with the
// given tls block lines.
func tlsRedisSite(addrs []string, fail, tlsBlock string) string {
	return redisSite(fmt.Sprintf("redis {\naddresses %s\ntimeout %s\ntls {\n%s\n}\n}", strings.Join(addrs, " "), redisTimeout, tlsBlock),
		redisRoute{path: "/tls", zone: "key header X-Client\nalgorithm fixed_window\nevents 5\nwindow 1h\nfail " + fail})
}

// tlsLines are a tls block's lines for a CA and a client certificate
// (none when pair is empty).
func tlsLines(ca string, pair testpki.Pair) string {
	lines := "ca " + ca
	if pair.CertFile != "" {
		lines += "\ncert " + pair.CertFile + "\nkey " + pair.KeyFile
	}
	return lines
}

// TestRedisTLSClientCertificate: a Caddy whose redis block connects over
// TLS with the tls block's CA and client certificate, to a redis-server
// that serves TLS only and requires client certificates, decides exactly:
// 5 requests pass, the 6th gets 429, on a standalone server and on a
// Cluster whose bus runs over TLS too. A wrong CA, no client certificate
// and an expired one each fail that Redis's decisions, the zone's fail
// mode applying (closed: 503, open: 200 without headers), and Caddy's log
// names the cause once at the start, as an error that names the fix, even
// when the server's refusal of the client certificate reached Caddy as a
// reset (TLS 1.3; the warm start then asks the server). The failed
// decisions' lines name the alert, or that reset.
func TestRedisTLSClientCertificate(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "e2e")
	harness := redistest.TLS{CA: ca, Client: ca.Client(t, "harness")}
	client := ca.Client(t, "caddy")
	standalone := redistest.StartTLS(t, harness)
	c := newClient(t)

	t.Run("standalone", func(t *testing.T) {
		inst := caddyproc.Start(t, tlsRedisSite([]string{standalone.Addr()}, "closed", tlsLines(ca.CertFile, client)))
		rs := sequence(t, c, 6, inst.URL("/tls"), clientHeader("exact")...)
		wantCodes(t, "over TLS with a client certificate", rs, 200, 200, 200, 200, 200, 429)
		wantRemaining(t, "over TLS", rs[:5], "tls", 4, 3, 2, 1, 0)
		if keys := redisDBSize(t, standalone); keys != 1 {
			t.Errorf("%d keys on the server, want the one client's", keys)
		}
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})

	t.Run("cluster", func(t *testing.T) {
		cluster := redistest.StartClusterTLS(t, 3, harness)
		inst := caddyproc.Start(t, tlsRedisSite(cluster.Addrs(), "closed", tlsLines(ca.CertFile, client)))
		for _, who := range []string{"a", "b", "c", "d"} {
			rs := sequence(t, c, 6, inst.URL("/tls"), clientHeader(who)...)
			wantCodes(t, "client "+who+" over TLS on a Cluster", rs, 200, 200, 200, 200, 200, 429)
		}
		if t.Failed() {
			t.Logf("caddy log:\n%s", inst.Log())
		}
	})

	other := testpki.NewCA(t, "other")
	for _, tc := range []struct {
		name  string
		tls   string
		fail  string
		code  int
		cause string // in the decisions' log lines
		fix   string // in the warm start's error
		// reset: the decisions may fail on a reset connection instead
		// (TLS 1.3: the server refuses the client's certificate after the
		// client's handshake is over and its command sent).
		reset bool
	}{
		{"wrong CA", tlsLines(other.CertFile, client), "closed", http.StatusServiceUnavailable,
			"x509: certificate signed by unknown authority", "the redis server's certificate is not signed by the tls block's ca", false},
		{"no client certificate", tlsLines(ca.CertFile, testpki.Pair{}), "open", http.StatusOK,
			"tls: certificate required", "the redis server requires a client certificate: set the tls block's cert and key", true},
		{"expired client certificate", tlsLines(ca.CertFile, ca.ExpiredClient(t, "expired")), "closed", http.StatusServiceUnavailable,
			"tls: expired certificate", "the redis server refused the client certificate as expired", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := caddyproc.Start(t, tlsRedisSite([]string{standalone.Addr()}, tc.fail, tc.tls))
			defer func() {
				if t.Failed() {
					t.Logf("caddy log:\n%s", inst.Log())
				}
			}()
			rs := sequence(t, c, 3, inst.URL("/tls"), clientHeader("refused")...)
			wantCodes(t, tc.name, rs, tc.code, tc.code, tc.code)
			for _, r := range rs {
				if r.hasRateLimitHeaders() {
					t.Errorf("%s: a response carries rate-limit fields: it was decided", tc.name)
				}
			}
			testutil.Eventually(t, "Caddy's log naming the cause and the fix", func() error {
				log := inst.Log()
				var fixes, failures int
				for line := range strings.SplitSeq(log, "\n") {
					switch {
					case strings.Contains(line, tc.fix) && strings.Contains(line, `"level":"error"`):
						fixes++
					case strings.Contains(line, "rate limit store failed") && (strings.Contains(line, tc.cause) ||
						tc.reset && (strings.Contains(line, "connection reset by peer") || strings.Contains(line, "broken pipe") || strings.Contains(line, ": EOF"))):
						failures++
					}
				}
				if fixes != 1 || failures == 0 {
					return fmt.Errorf("%d error lines naming the fix %q (want 1), %d failed decisions naming %q (want some)", fixes, tc.fix, failures, tc.cause)
				}
				return nil
			})
		})
	}
}

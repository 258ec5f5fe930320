package e2e

// The harness's Redis half: Caddyfiles whose zones keep their state in
// Redis, and what tests read from a server as an operator would with
// redis-cli (keys, INFO, CLIENT LIST).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/caddyproc"
	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
)

// redisTimeout is the decision timeout of tests that need every decision
// to come from Redis: far above a round trip even on a loaded machine.
const redisTimeout = "2s"

// redisRoute is one path of a test site: a rate_limit with a single zone,
// named after the path, answered by `respond` or by a reverse proxy.
type redisRoute struct {
	// path is matched exactly; the zone is named path without its slash.
	path string
	// zone holds the zone's options, one per line.
	zone string
	// upstream, when set, is a reverse_proxy target instead of respond.
	upstream string
}

// redisSite is a Caddyfile with one site whose routes each have their own
// rate_limit with the given redis block. The redis blocks are identical, so
// the routes share one pooled client, as an operator's would.
func redisSite(redisBlock string, routes ...redisRoute) string {
	var b strings.Builder
	b.WriteString(globalsWith(""))
	b.WriteString("\nhttp://{{http}} {\n")
	for _, r := range routes {
		fmt.Fprintf(&b, "\thandle %s {\n\t\trate_limit {\n\t\t\tzone %s {\n", r.path, strings.TrimPrefix(r.path, "/"))
		for line := range strings.SplitSeq(strings.TrimSpace(r.zone), "\n") {
			fmt.Fprintf(&b, "\t\t\t\t%s\n", strings.TrimSpace(line))
		}
		b.WriteString("\t\t\t\tstore redis\n\t\t\t}\n")
		for line := range strings.SplitSeq(strings.TrimSpace(redisBlock), "\n") {
			fmt.Fprintf(&b, "\t\t\t%s\n", strings.TrimSpace(line))
		}
		b.WriteString("\t\t}\n")
		if r.upstream != "" {
			fmt.Fprintf(&b, "\t\treverse_proxy %s\n", r.upstream)
		} else {
			b.WriteString("\t\trespond \"ok\"\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// redisURLBlock is a redis block for a standalone server.
func redisURLBlock(addr, timeout string) string {
	return fmt.Sprintf("redis {\nurl redis://%s\ntimeout %s\n}", addr, timeout)
}

// startRedisSite starts a standalone redis-server and a Caddy serving
// redisSite on it with the given decision timeout: the setup of every test
// that needs one server and whose zones need nothing else of the config.
func startRedisSite(t *testing.T, timeout string, routes ...redisRoute) (*redistest.Server, *caddyproc.Instance) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, caddyproc.Start(t, redisSite(redisURLBlock(srv.Addr(), timeout), routes...))
}

// redisReply is the reply to one command (named by what in the failure)
// run on s within 10s; an error fails the test, so what the tests read
// from a server is one line each.
func redisReply[T any](t *testing.T, s *redistest.Server, what string, cmd func(ctx context.Context) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cmd(ctx)
	if err != nil {
		t.Fatalf("%s on %s: %v", what, s.Addr(), err)
	}
	return v
}

// redisDBSize is the number of keys on one server.
func redisDBSize(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	return redisReply(t, s, "DBSIZE", func(ctx context.Context) (int64, error) {
		return s.Client(t).DBSize(ctx).Result()
	})
}

// configRedisSite is a one-zone site for config tests; body tells configs
// apart, and the client is named so CLIENT LIST shows Caddy's connections.
func configRedisSite(redisAddr, body string) string {
	return oneRedisZoneSite("cfg", "sliding_window_log\nevents 3\nwindow 1h\nfail closed", redisAddr, redisTimeout, body)
}

// oneRedisZoneSite is a site with one redis zone named zone, keyed by the
// X-Client header, with the given algorithm line's value and further
// options (one per line), a named client (so CLIENT LIST shows Caddy's
// connections) and the decision timeout; body tells configs apart.
func oneRedisZoneSite(zone, algorithm, redisAddr, timeout, body string) string {
	var opts strings.Builder
	for line := range strings.SplitSeq("algorithm "+algorithm, "\n") {
		fmt.Fprintf(&opts, "\t\t\t%s\n", line)
	}
	return globalsWith("") + fmt.Sprintf(`
http://{{http}} {
	rate_limit {
		zone %s {
			key header X-Client
%s			store redis
		}
		redis {
			url redis://%s/0?client_name=floodgate-caddy
			timeout %s
		}
	}
	respond %q
}
`, zone, opts.String(), redisAddr, timeout, body)
}

// clientsNamed is CLIENT LIST on s: the connections whose client name
// (set with client_name in a redis block's url) match names, each as its
// fields, such as "id" and "name".
func clientsNamed(t *testing.T, s *redistest.Server, match func(name string) bool) []map[string]string {
	t.Helper()
	list := redisReply(t, s, "CLIENT LIST", func(ctx context.Context) (string, error) {
		return s.Client(t).ClientList(ctx).Result()
	})
	var out []map[string]string
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		fields := map[string]string{}
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			fields[k] = v
		}
		if match(fields["name"]) {
			out = append(out, fields)
		}
	}
	return out
}

// caddyConnIDs lists the ids of the connections named floodgate-caddy on
// a server: Caddy's, per oneRedisZoneSite.
func caddyConnIDs(t *testing.T, s *redistest.Server) []string {
	t.Helper()
	var ids []string
	for _, c := range clientsNamed(t, s, func(name string) bool { return name == "floodgate-caddy" }) {
		ids = append(ids, c["id"])
	}
	slices.Sort(ids)
	return ids
}

// infoInt is an integer field of an INFO section on s, such as
// used_memory_dataset of "memory".
func infoInt(t *testing.T, s *redistest.Server, section, field string) int64 {
	t.Helper()
	info := redisReply(t, s, "INFO "+section, func(ctx context.Context) (string, error) {
		return s.Client(t).Info(ctx, section).Result()
	})
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s %q: %v", section, field, v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s: %s", section, field, info)
	return 0
}

// evalCalls is how many scripts a server has run for clients (EVALSHA
// and EVAL in INFO commandstats). A replica runs none: Redis 7 replicates
// a script's effects, not the script.
func evalCalls(ctx context.Context, c *redis.Client) (int64, error) {
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for line := range strings.SplitSeq(stats, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:calls=") && !strings.HasPrefix(line, "cmdstat_eval:calls=") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		calls, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n, nil
}

// decided says why r was not decided by its zone in Redis: it carries no
// rate-limit field, as a zone that failed open answers.
func decided(r response) error {
	if r.hasRateLimitHeaders() {
		return nil
	}
	return fmt.Errorf("status %d without rate-limit fields: the zone failed open", r.code)
}

// decidedClosed says why r, of a `fail closed` zone, was not decided in
// Redis: it is the 503 that zone answers while Redis fails.
func decidedClosed(r response) error {
	if r.code == http.StatusServiceUnavailable {
		return errors.New("503: the zone fails closed")
	}
	return nil
}

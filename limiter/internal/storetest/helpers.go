package storetest

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
)

// MustAdmit takes one unit of key from s and fails the test unless it is
// admitted.
func MustAdmit(t testing.TB, s limiter.Store, key string) limiter.Admission {
	t.Helper()
	d, err := s.Take(context.Background(), key, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	return d
}

// AdmitAll takes unit requests of key from s until one is refused, at
// most most of them, and reports how many were admitted.
func AdmitAll(t testing.TB, s limiter.Store, key string, most int64) (admitted int64) {
	t.Helper()
	for range most {
		a, err := s.Take(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Allowed {
			break
		}
		admitted++
	}
	return admitted
}

// AlignedBase is a realistic Unix time in µs that starts a window of p, so
// steps can name window boundaries by their offset.
func AlignedBase(p limiter.Policy) int64 {
	w := p.Window.Microseconds()
	return 1_700_000_000_000_000 / w * w
}

// NewMemory is a memory store of p on a manual clock set to AlignedBase.
func NewMemory(t testing.TB, p limiter.Policy, opts limiter.MemoryOptions) (*limiter.Memory, *testutil.Clock) {
	t.Helper()
	clock := &testutil.Clock{}
	clock.SetMicro(AlignedBase(p))
	opts.Clock = clock
	m, err := limiter.NewMemory(p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, clock
}

// AwayFromHourEnd waits, when less than 30 s are left of the current
// hour, until the next one has begun: an hourly window must not turn over
// while a test counts in it.
func AwayFromHourEnd() {
	if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < 30*time.Second {
		time.Sleep(left + time.Second)
	}
}

// InstanceClients is n clients made by newClient, one per simulated
// instance; the caller closes them (CloseClients).
func InstanceClients(tb testing.TB, newClient func() (redis.UniversalClient, error), n int) []redis.UniversalClient {
	tb.Helper()
	clients := make([]redis.UniversalClient, n)
	for i := range clients {
		c, err := newClient()
		if err != nil {
			_ = CloseClients(clients[:i])
			tb.Fatal(err)
		}
		clients[i] = c
	}
	return clients
}

// CloseClients closes clients and reports the first error.
func CloseClients(clients []redis.UniversalClient) error {
	var first error
	for _, c := range clients {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// ScriptCalls is how many script calls Redis has run since its statistics
// were last reset: EVAL, EVALSHA and their read-only forms.
func ScriptCalls(ctx context.Context, c redis.UniversalClient) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var calls int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, stats, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		switch name {
		case "cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro":
		default:
			continue
		}
		for _, field := range strings.Split(stats, ",") {
			if v, found := strings.CutPrefix(field, "calls="); found {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				calls += n
			}
		}
	}
	return calls, sc.Err()
}

// Shards are standalone servers for a sharded store.
type Shards []*redistest.Server

// StartShards starts n standalone servers.
func StartShards(t *testing.T, n int) Shards {
	t.Helper()
	s := make(Shards, n)
	for i := range s {
		s[i] = redistest.Start(t)
	}
	return s
}

// Addrs are the shards' addresses, in order.
func (s Shards) Addrs() []string {
	a := make([]string, len(s))
	for i, srv := range s {
		a[i] = srv.Addr()
	}
	return a
}

// OverrideTableOf is a table of n limit overrides, keys "user-<100000+i>",
// built as a load builds it.
func OverrideTableOf(n int) *limiter.OverrideTable {
	m := make(map[string]limiter.Override, n)
	for i := range n {
		m[fmt.Sprintf("user-%d", 100_000+i)] = limiter.Override{Action: limiter.OverrideLimit, Events: 1000, Window: time.Minute, Expires: time.UnixMilli(1_900_000_000_000)}
	}
	t := limiter.NewOverrideTable()
	t.Replace(m)
	return t
}

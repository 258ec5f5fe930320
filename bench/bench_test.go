// Package bench compares Floodgate's Redis store with go-redis/redis_rate on
// one redis-server, in a module of its own so the root module never depends
// on redis_rate. Run it with redis.sh, or point REDIS_ADDR at a server of
// your own; without either it starts one with internal/redistest.
package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/floodgatehq/caddy-ratelimit/internal/redistest"
	"github.com/floodgatehq/caddy-ratelimit/internal/testpki"
	"github.com/floodgatehq/caddy-ratelimit/limiter"
	"github.com/floodgatehq/caddy-ratelimit/limiter/redisstore"
)

// callers is how many goroutines call the limiter at once.
const callers = 64

// clients is how many distinct client keys the calls spread over.
const clients = 10_000

// storeTimeout is the Redis store's per-decision timeout here: far above
// any answer time, so no decision fails while the machine is saturated.
const storeTimeout = 10 * time.Second

// serverAddr is REDIS_ADDR, or a server started for this test: with
// BENCH_TLS=1 one that serves TLS only and requires a client certificate,
// which tlsConfigs then holds the clients' TLS for (redis.sh's TLS run).
func serverAddr(t testing.TB) string {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	if os.Getenv("BENCH_TLS") == "1" {
		ca := testpki.NewCA(t, "bench")
		s := redistest.StartTLS(t, redistest.TLS{CA: ca, Client: ca.Client(t, "bench")})
		tlsConfigs.Store(s.Addr(), s.TLSConfig())
		return s.Addr()
	}
	return redistest.Start(t).Addr()
}

// tlsConfigs maps the address of a TLS server serverAddr started to the
// TLS its clients connect with.
var tlsConfigs sync.Map

func newClient(t testing.TB, addr string) *redis.Client {
	opts := &redis.Options{Addr: addr, PoolSize: callers, ContextTimeoutEnabled: true}
	if conf, ok := tlsConfigs.Load(addr); ok {
		opts.TLSConfig = conf.(*tls.Config)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", addr, err)
	}
	return c
}

// cpuTimes reads the CPU time used so far by this process and by the
// redis-server behind client. On a machine shared with other work, CPU time
// per decision is a steadier measure than wall time.
func cpuTimes(b *testing.B, client *redis.Client) (self, server time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	info, err := client.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			sec, err := strconv.ParseFloat(value, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", line, err)
			}
			server += time.Duration(sec * float64(time.Second))
		}
	}
	return self, server
}

// parallel runs take with n concurrent goroutines (n is callers or 1),
// each call for one of clients keys, and fails b if any call failed. Besides
// ns/op it reports the CPU time per decision of this process (the client)
// and of Redis. With one caller, ns/op is the time one decision takes.
func parallel(b *testing.B, client *redis.Client, n int, take func(ctx context.Context, key string) error) {
	var seq, failed atomic.Int64
	self0, server0 := cpuTimes(b, client)
	b.ResetTimer()
	if n == 1 {
		ctx := context.Background()
		for range b.N {
			if err := take(ctx, "client-"+strconv.FormatInt(seq.Add(1)%clients, 10)); err != nil {
				failed.Add(1)
			}
		}
	} else {
		b.SetParallelism((n + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if err := take(ctx, "client-"+strconv.FormatInt(seq.Add(1)%clients, 10)); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d calls failed", n)
	}
	self1, server1 := cpuTimes(b, client)
	b.ReportMetric(float64((self1-self0).Microseconds())/float64(b.N), "client-cpu-µs/op")
	b.ReportMetric(float64((server1-server0).Microseconds())/float64(b.N), "redis-cpu-µs/op")
}

// BenchmarkCompare runs redis_rate's GCRA Allow and Floodgate's token
// bucket, the same limit, back to back on the same server with the same
// client settings, in four settings:
//
//   - steady: 60/min with a burst of 1000. Each key is hit about every 0.4 s
//     and its state lives longer than that, so every call updates a key
//     that exists, in both limiters.
//   - expiring: 1000/min with a burst of 1000. One token comes back in
//     60 ms, so Floodgate's key (whose TTL is exactly what the state needs)
//     has expired before the next hit, and most calls delete an expired key
//     and create a new one; redis_rate rounds its TTL up to whole seconds
//     and keeps most keys alive.
//   - lone: steady's limit with one caller, calling again as soon as it has
//     an answer: the time one decision takes when nothing else is under
//     way, where Floodgate's store has no concurrent decisions to share a
//     round trip with.
//   - algorithms: every Floodgate algorithm at 1000/min (burst 1000 for
//     the buckets) next to redis_rate at the same limit, each one decision
//     per call whether it allows or refuses; the concurrency row takes and
//     releases, two decisions per call.
func BenchmarkCompare(b *testing.B) {
	client := newClient(b, serverAddr(b))
	for _, set := range []struct {
		name          string
		events, burst int
		callers       int
	}{
		{"steady", 60, 1000, callers},
		{"expiring", 1000, 1000, callers},
		{"lone", 60, 1000, 1},
		{"algorithms", 1000, 1000, callers},
	} {
		type row struct {
			name string
			run  func(b *testing.B)
		}
		// floodgate is the row of one of Floodgate's algorithms.
		floodgate := func(alg limiter.Algorithm) row {
			return row{"floodgate_" + string(alg), func(b *testing.B) {
				p := limiter.Policy{Algorithm: alg, Events: int64(set.events), Window: time.Minute}
				if alg == limiter.TokenBucket || alg == limiter.LeakyBucket {
					p.Burst = int64(set.burst)
				}
				store, err := redisstore.New(client, p, redisstore.Options{Zone: "bench-" + set.name, Timeout: storeTimeout})
				if err != nil {
					b.Fatal(err)
				}
				parallel(b, client, set.callers, func(ctx context.Context, key string) error {
					d, err := store.Take(ctx, key, 1)
					if err == nil && alg == limiter.Concurrency && d.Allowed {
						_, err = d.Release(ctx)
					}
					return err
				})
			}}
		}
		limiters := []row{
			{"redis_rate", func(b *testing.B) {
				rl := redis_rate.NewLimiter(client)
				limit := redis_rate.Limit{Rate: set.events, Burst: set.burst, Period: time.Minute}
				parallel(b, client, set.callers, func(ctx context.Context, key string) error {
					_, err := rl.Allow(ctx, set.name+key, limit)
					return err
				})
			}},
			// The same, under the per-call context timeout the Redis store
			// applies to every decision: what the timer itself costs.
			{"redis_rate_with_timeout", func(b *testing.B) {
				rl := redis_rate.NewLimiter(client)
				limit := redis_rate.Limit{Rate: set.events, Burst: set.burst, Period: time.Minute}
				parallel(b, client, set.callers, func(ctx context.Context, key string) error {
					ctx, cancel := context.WithTimeout(ctx, storeTimeout)
					defer cancel()
					_, err := rl.Allow(ctx, set.name+"t"+key, limit)
					return err
				})
			}},
			floodgate(limiter.TokenBucket),
		}
		if set.name == "algorithms" {
			limiters = slices.Delete(limiters, 1, 2) // the timeout row is steady's question
			for _, alg := range limiter.Algorithms {
				if alg != limiter.TokenBucket {
					limiters = append(limiters, floodgate(alg))
				}
			}
		}
		// redis.sh reverses the order every other run, so neither limiter
		// always runs first on a fresh server or last on a warm one.
		if os.Getenv("BENCH_REVERSE") != "" {
			slices.Reverse(limiters)
		}
		for _, l := range limiters {
			b.Run(set.name+"/"+l.name, l.run)
		}
	}
}

// TestMemoryPerKey fills 10,000 keys per algorithm, each with one request of
// state, and prints the average MEMORY USAGE per key, redis_rate's included.
// The token bucket must stay within 120 bytes a key.
func TestMemoryPerKey(t *testing.T) {
	client := newClient(t, serverAddr(t))
	ctx := context.Background()
	const n = 10_000

	type measured struct {
		name  string
		keys  []string
		bytes float64
	}
	var rows []measured

	// fill calls take for client keys 0..n-1 from 16 goroutines.
	fill := func(take func(key string) error) {
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := range 16 {
			wg.Go(func() {
				for i := g; i < n; i += 16 {
					if err := take(fmt.Sprintf("mem-client-%d", i)); err != nil {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%d takes failed", failed.Load())
		}
	}

	policies := []struct {
		name string
		p    limiter.Policy
	}{
		// 7 per hour does not divide an hour into whole microseconds per
		// unit, so the bucket's state keeps a fraction beside tat.
		{"token_bucket 7/h", limiter.Policy{Algorithm: limiter.TokenBucket, Events: 7, Window: time.Hour}},
	}
	for _, alg := range limiter.Algorithms {
		policies = append(policies, struct {
			name string
			p    limiter.Policy
		}{string(alg), limiter.Policy{Algorithm: alg, Events: 100, Window: time.Hour}})
	}
	for i, pol := range policies {
		// Zone names of one length, so key names weigh the same.
		store, err := redisstore.New(client, pol.p, redisstore.Options{Zone: fmt.Sprintf("zone%d", i), Timeout: storeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		fill(func(key string) error {
			_, err := store.Take(ctx, key, 1)
			return err
		})
		keys := make([]string, n)
		for i := range keys {
			keys[i] = store.Key(fmt.Sprintf("mem-client-%d", i))
		}
		rows = append(rows, measured{name: pol.name, keys: keys})
	}
	rl := redis_rate.NewLimiter(client)
	fill(func(key string) error {
		_, err := rl.Allow(ctx, key, redis_rate.PerHour(100))
		return err
	})
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "rate:" + fmt.Sprintf("mem-client-%d", i)
	}
	rows = append(rows, measured{name: "redis_rate (GCRA)", keys: keys})

	fmt.Printf("%-24s %12s %s\n", "algorithm", "bytes/key", "example key")
	for i := range rows {
		r := &rows[i]
		var total int64
		for _, k := range r.keys {
			b, err := client.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				t.Fatalf("%s: MEMORY USAGE %s: %v", r.name, k, err)
			}
			total += b
		}
		r.bytes = float64(total) / float64(len(r.keys))
		fmt.Printf("%-24s %12.1f %s\n", r.name, r.bytes, r.keys[0])
	}
	for _, r := range rows[:2] {
		if r.bytes > 120 {
			t.Errorf("%s: %.1f bytes per key, want at most 120", r.name, r.bytes)
		}
	}
}

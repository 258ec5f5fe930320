#!/usr/bin/env bash
# Compares Floodgate's Redis token bucket with go-redis/redis_rate on one
# redis-server started here on a free 127.0.0.1 port, then prints a table of
# throughput at 64 concurrent callers, of the time one decision takes for a
# lone caller, and of Redis memory per key.
#
#   bench/redis.sh [benchtime] [count]     defaults: 2s 5
set -euo pipefail
cd "$(dirname "$0")"
benchtime=${1:-2s}
count=${2:-5}

command -v redis-server >/dev/null || { echo "redis-server is not on PATH" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
	shuf -i 20000-60000 -n 1)
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no >"$dir/redis.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	kill -0 "$pid" 2>/dev/null || { cat "$dir/redis.log" >&2; exit 1; }
	sleep 0.05
done
export REDIS_ADDR=127.0.0.1:$port
echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on $REDIS_ADDR; $(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nproc) CPUs"
echo

# One test binary, run count times: each run measures redis_rate and
# Floodgate back to back, in reverse order every other run, so they share
# whatever else the machine does and neither always goes first.
go test -c -o "$dir/bench.test" . >/dev/null
runs=""
for i in $(seq "$count"); do
	reverse=$([ $((i % 2)) = 0 ] && echo 1 || true)
	runs+=$(BENCH_REVERSE=$reverse "$dir/bench.test" -test.run '^$' -test.bench 'BenchmarkCompare' -test.benchtime "$benchtime") || { echo "$runs" >&2; exit 1; }
	runs+=$'\n'
done
echo "Token bucket (algorithms: all), 64 concurrent callers (lone: 1), 10,000 client keys: median of $count alternating runs of -benchtime $benchtime"
echo "(vs redis_rate: the median over runs of redis_rate's ns/op divided by this row's in the same run, above 1 is faster;"
echo " faster: in how many runs this row beat redis_rate)"
echo "(steady: 60/min burst 1000, keys outlive the gaps between hits; expiring: 1000/min burst 1000, Floodgate's exact TTLs lapse between hits;"
echo " lone: steady with one caller, so ns/op is the time one decision takes; algorithms: every algorithm at 1000/min)"
summarize() { awk '
	/^BenchmarkCompare\// {
		name = $1; sub(/^BenchmarkCompare\//, "", name); sub(/-[0-9]+$/, "", name)
		if (!(name in seen)) { seen[name] = 1; names[++k] = name }
		i = ++n[name]; ns[name, i] = $3; cl[name, i] = $5; rd[name, i] = $7
	}
	function median(arr, name, m,    i, j, t, v) {
		for (i = 1; i <= m; i++) v[i] = arr[name, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
	}
	END {
		printf "%-44s %10s %12s %16s %16s %14s %8s\n", "setting/limiter", "ns/op", "decisions/s", "client CPU µs/op", "Redis CPU µs/op", "vs redis_rate", "faster"
		for (i = 1; i <= k; i++) {
			nm = names[i]; m = median(ns, nm, n[nm])
			# Speed relative to redis_rate in the same setting, run by run
			# (the two ran back to back), then the median of those ratios:
			# steadier than a ratio of medians when the machine drifts.
			base = nm; sub(/\/.*/, "/redis_rate", base)
			faster = 0
			for (j = 1; j <= n[nm]; j++) { rel[nm, j] = ns[base, j] / ns[nm, j]; if (rel[nm, j] > 1) faster++ }
			printf "%-44s %10.0f %12.0f %16.2f %16.2f %13.3fx %5d/%-2d\n", nm, m, 1e9 / m, median(cl, nm, n[nm]), median(rd, nm, n[nm]), median(rel, nm, n[nm]), faster, n[nm]
		}
	}'; }
echo "$runs" | summarize
echo

# The same over TLS, in the same run: the test binary starts a redis-server
# of the same build that serves TLS only and requires a client certificate
# (certificates made by the test with Go's crypto), and the clients connect
# with TLS 1.3. Settings steady and lone: throughput and one decision's time.
tls_runs=""
for i in $(seq "$count"); do
	reverse=$([ $((i % 2)) = 0 ] && echo 1 || true)
	tls_runs+=$(REDIS_ADDR='' BENCH_TLS=1 BENCH_REVERSE=$reverse "$dir/bench.test" -test.run '^$' -test.bench 'BenchmarkCompare/(steady|lone)/' -test.benchtime "$benchtime") || { echo "$tls_runs" >&2; exit 1; }
	tls_runs+=$'\n'
done
echo "Over TLS (client certificate required), settings steady and lone: median of $count alternating runs of -benchtime $benchtime"
echo "$tls_runs" | summarize
echo

mem=$(go test -run 'TestMemoryPerKey' -v -count 1 . 2>&1) || { echo "$mem" >&2; exit 1; }
echo "Redis MEMORY USAGE per key, averaged over 10,000 keys (100/h unless named):"
echo "$mem" | sed -n '/^algorithm/,/^---/p' | grep -v '^---'

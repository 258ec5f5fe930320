#!/usr/bin/env bash
# Compares Floodgate's Redis token bucket with go-redis/redis_rate on a
# server started here on a free 127.0.0.1 port, then prints a table of
# throughput at 64 concurrent callers, of the time one decision takes for a
# lone caller, and of Redis memory per key.
#
#   bench/redis.sh [benchtime] [count] [servers]     defaults: 2s 5 redis
#
# servers is a space-separated list, each as FLOODGATE_REDIS_SERVER takes it
# (internal/redistest): redis (redis-server), valkey (valkey-server), or the
# absolute path of a server binary; without the argument, that variable, or
# redis. With more than one ("redis valkey"), every server is started, each
# run measures them one after another (in reverse order every other run),
# each gets its own table, and a last table sets their decisions per second
# side by side. Each run also measures every server over TLS (settings
# steady and lone): the test binary starts a server of the same binary that
# serves TLS only and requires a client certificate (certificates made by
# the test with Go's crypto), and the clients connect with TLS 1.3.
set -euo pipefail
cd "$(dirname "$0")"
benchtime=${1:-2s}
count=${2:-5}
read -r -a servers <<<"${3:-${FLOODGATE_REDIS_SERVER:-redis}}"
[ "${#servers[@]}" -gt 0 ] || servers=(redis)

dir=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

# start_server <k> <spec>: starts the server spec names on a free port,
# waits until it answers PING, and sets addr[k] and label[k].
addr=()
label=()
start_server() {
	local k=$1 spec=$2 bin cli port pid
	case $spec in
	redis) bin=redis-server cli=redis-cli ;;
	valkey) bin=valkey-server cli=valkey-cli ;;
	/*)
		bin=$spec cli=$(dirname "$spec")/$(basename "$spec" -server)-cli
		[ -x "$cli" ] || cli=$(command -v redis-cli || command -v valkey-cli || echo redis-cli)
		;;
	*) echo "server '$spec': want redis, valkey or the absolute path of a server binary" >&2; exit 1 ;;
	esac
	command -v "$bin" >/dev/null || { echo "$bin is not on PATH" >&2; exit 1; }
	command -v "$cli" >/dev/null || { echo "$cli is not on PATH" >&2; exit 1; }
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		shuf -i 20000-60000 -n 1)
	mkdir -p "$dir/server$k"
	"$bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir/server$k" --daemonize no >"$dir/server$k.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 200); do
		"$cli" -p "$port" ping >/dev/null 2>&1 && break
		kill -0 "$pid" 2>/dev/null || { cat "$dir/server$k.log" >&2; exit 1; }
		sleep 0.05
	done
	addr[k]=127.0.0.1:$port
	label[k]="$(basename "$bin") $("$bin" --version | sed 's/.*v=\([^ ]*\).*/\1/')"
}
for k in "${!servers[@]}"; do start_server "$k" "${servers[k]}"; done

# One test binary, run count times: each run measures redis_rate and
# Floodgate back to back, in reverse order every other run, so they share
# whatever else the machine does and neither always goes first; with more
# than one server, each run measures every server in turn, likewise
# reversed every other run.
go test -c -o "$dir/bench.test" . >/dev/null
order=("${!servers[@]}")
for i in $(seq "$count"); do
	reverse=$([ $((i % 2)) = 0 ] && echo 1 || true)
	ks=("${order[@]}")
	if [ -n "$reverse" ]; then
		ks=()
		for ((j = ${#order[@]} - 1; j >= 0; j--)); do ks+=("${order[j]}"); done
	fi
	for k in "${ks[@]}"; do
		out=$(REDIS_ADDR=${addr[k]} BENCH_REVERSE=$reverse "$dir/bench.test" -test.run '^$' -test.bench 'BenchmarkCompare' -test.benchtime "$benchtime") ||
			{ echo "$out" >&2; exit 1; }
		echo "$out" | sed -n "s/^\(BenchmarkCompare\/\)/run=$i \1/p" >>"$dir/runs$k"
		out=$(FLOODGATE_REDIS_SERVER=${servers[k]} REDIS_ADDR='' BENCH_TLS=1 BENCH_REVERSE=$reverse "$dir/bench.test" -test.run '^$' -test.bench 'BenchmarkCompare/(steady|lone)/' -test.benchtime "$benchtime") ||
			{ echo "$out" >&2; exit 1; }
		echo "$out" | sed -n "s/^\(BenchmarkCompare\/\)/run=$i \1/p" >>"$dir/runs$((k + ${#servers[@]}))"
	done
done
# The TLS runs' labels follow the servers'.
for k in "${!servers[@]}"; do label[k + ${#servers[@]}]="${label[k]} TLS"; done

# table prints one server's table from its runs.
table() {
	awk '
	/^run=[0-9]+ BenchmarkCompare\// {
		name = $2; sub(/^BenchmarkCompare\//, "", name); sub(/-[0-9]+$/, "", name)
		if (!(name in seen)) { seen[name] = 1; names[++k] = name }
		i = ++n[name]; ns[name, i] = $4; cl[name, i] = $6; rd[name, i] = $8
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
	}' "$1"
}

cpu="$(lscpu | grep 'Model name' | sed 's/  */ /g'); $(nproc) CPUs"
for k in "${!servers[@]}"; do
	export REDIS_ADDR=${addr[k]}
	[ "$k" = 0 ] || echo
	echo "${label[k]} on $REDIS_ADDR; $cpu"
	echo
	echo "Token bucket (algorithms: all), 64 concurrent callers (lone: 1), 10,000 client keys: median of $count alternating runs of -benchtime $benchtime"
	echo "(vs redis_rate: the median over runs of redis_rate's ns/op divided by this row's in the same run, above 1 is faster;"
	echo " faster: in how many runs this row beat redis_rate)"
	echo "(steady: 60/min burst 1000, keys outlive the gaps between hits; expiring: 1000/min burst 1000, Floodgate's exact TTLs lapse between hits;"
	echo " lone: steady with one caller, so ns/op is the time one decision takes; algorithms: every algorithm at 1000/min)"
	table "$dir/runs$k"
	echo
	echo "Over TLS (client certificate required), settings steady and lone: median of $count alternating runs of -benchtime $benchtime"
	table "$dir/runs$((k + ${#servers[@]}))"
	echo

	mem=$(go test -run 'TestMemoryPerKey' -v -count 1 . 2>&1) || { echo "$mem" >&2; exit 1; }
	echo "Redis MEMORY USAGE per key, averaged over 10,000 keys (100/h unless named):"
	echo "$mem" | sed -n '/^algorithm/,/^---/p' | grep -v '^---'
done

# Side by side, the TLS runs as servers of their own: each server's median decisions per second and server CPU
# per decision (steadier than wall time on a shared machine), and its speed
# relative to the first server's, run by run (the servers ran one after
# another within each run), then the median of those ratios.
echo
echo "Decisions per second and server CPU µs per decision by server, median of $count runs"
echo "(vs ${label[0]}: the median over runs of its ns/op divided by this server's in the same run, above 1 is faster)"
for k in "${!label[@]}"; do sed "s/^/server=$k /" "$dir/runs$k"; done | awk -v labels="$(printf '%s\n' "${label[@]}")" '
	BEGIN { ns_ = split(labels, lab, "\n") }
	{
		s = substr($1, 8) + 1; r = substr($2, 5) + 0
		name = $3; sub(/^BenchmarkCompare\//, "", name); sub(/-[0-9]+$/, "", name)
		if (!(name in seen)) { seen[name] = 1; names[++k] = name }
		ns[name, s, r] = $5; rd[name, s, r] = $9
		if (r > maxr) maxr = r
	}
	function median(v, m,    i, j, t) {
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
	}
	END {
		printf "%-44s", "setting/limiter"
		for (s = 1; s <= ns_; s++) printf " %28s", lab[s] " dec/s"
		for (s = 1; s <= ns_; s++) printf " %28s", lab[s] " CPU µs"
		for (s = 2; s <= ns_; s++) printf " %28s", "vs " lab[1]
		printf "\n"
		for (i = 1; i <= k; i++) {
			nm = names[i]; printf "%-44s", nm
			for (s = 1; s <= ns_; s++) {
				m = 0; delete v
				for (r = 1; r <= maxr; r++) if ((nm, s, r) in ns) v[++m] = ns[nm, s, r]
				if (m == 0) { printf " %28s", "-"; continue }
				printf " %28.0f", 1e9 / median(v, m)
			}
			for (s = 1; s <= ns_; s++) {
				m = 0; delete v
				for (r = 1; r <= maxr; r++) if ((nm, s, r) in rd) v[++m] = rd[nm, s, r]
				if (m == 0) { printf " %28s", "-"; continue }
				printf " %28.2f", median(v, m)
			}
			for (s = 2; s <= ns_; s++) {
				m = 0; delete v
				for (r = 1; r <= maxr; r++) if ((nm, s, r) in ns && (nm, 1, r) in ns) v[++m] = ns[nm, 1, r] / ns[nm, s, r]
				if (m == 0) { printf " %28s", "-"; continue }
				printf " %27.3fx", median(v, m)
			}
			printf "\n"
		}
	}'

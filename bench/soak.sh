#!/usr/bin/env bash
# Soak: mixed traffic for a while against one Caddy with Floodgate and one
# redis-server, both started here on free 127.0.0.1 ports, with a config
# reload through the admin API every 10 s (every other one changes a memory
# zone's limit, so a new store replaces the old) and Redis restarted once
# halfway. Every 10 s it prints the elapsed time, Caddy's RSS (VmRSS), its
# goroutines (the admin endpoint's /debug/pprof/goroutine?debug=1) and the
# connections Redis has (INFO clients: connected_clients, the script's own
# redis-cli included), so anything that grows with time shows as a trend.
#
# Traffic: bench/soakload (a Go program of this module), 4 workers at a
# fixed pace over a memory zone pair, two Redis zones (fail local, one with
# local_quota leases) and a Redis concurrency zone, with 20,000 client keys
# of which 0.1% send half the requests (those get refused).
#
# Usage: bench/soak.sh <duration in seconds>     (default 600)
# Env:   CADDY_BIN (a prebuilt Caddy with Floodgate instead of go build)
set -euo pipefail
cd "$(dirname "$0")"
duration=${1:-600}
case $duration in '' | *[!0-9]*) echo "usage: $0 <seconds>" >&2; exit 2 ;; esac

command -v redis-server >/dev/null || { echo "redis-server is not on PATH" >&2; exit 1; }
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
caddy_pid="" redis_pid="" load_pid=""
cleanup() {
	for pid in $load_pid $caddy_pid $redis_pid; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

caddy=${CADDY_BIN:-}
if [ -z "$caddy" ]; then
	(cd .. && go build -o "$work/caddy" ./cmd/caddy)
	caddy=$work/caddy
fi
go build -o "$work/soakload" ./soakload

admin=$(freeport) http=$(freeport) rport=$(freeport)

start_redis() {
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --daemonize no >>"$work/redis.log" 2>&1 &
	redis_pid=$!
	for _ in $(seq 200); do
		redis-cli -p "$rport" ping >/dev/null 2>&1 && return 0
		kill -0 "$redis_pid" 2>/dev/null || { cat "$work/redis.log" >&2; exit 1; }
		sleep 0.05
	done
	echo "redis-server did not answer" >&2
	exit 1
}

# config <generation>: the body names the generation, so every reload
# changes the config; odd generations also change the memory zone's limit.
config() {
	local gen=$1 events=$((20 + $1 % 2))
	cat <<CADDY
{
	admin 127.0.0.1:$admin
	default_bind 127.0.0.1
	auto_https off
	persist_config off
}
http://127.0.0.1:$http {
	handle /mem {
		rate_limit {
			zone soak_mem {
				key header X-Client
				algorithm token_bucket
				events $events
				window 10s
			}
			zone soak_mem_log {
				key header X-Client
				events 10
				window 5s
			}
			sweep_interval 10s
		}
		respond "mem $gen"
	}
	handle /redis {
		rate_limit {
			zone soak_redis {
				key header X-Client
				algorithm sliding_window_counter
				rate 10/10s
				store redis
				fail local
			}
			zone soak_redis_tb {
				key header X-Client
				algorithm token_bucket
				rate 20/10s
				store redis
				fail local
				local_quota 0.2
			}
			redis {
				url redis://127.0.0.1:$rport
				timeout 50ms
			}
		}
		respond "redis $gen"
	}
	handle /conc {
		rate_limit {
			zone soak_conc {
				key header X-Client
				algorithm concurrency
				events 2
				store redis
			}
			redis {
				url redis://127.0.0.1:$rport
				timeout 50ms
			}
		}
		respond "conc $gen"
	}
}
CADDY
}

start_redis
config 0 >"$work/Caddyfile"
HOME=$work XDG_DATA_HOME=$work/data XDG_CONFIG_HOME=$work/config \
	"$caddy" run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.log" 2>&1 &
caddy_pid=$!
for _ in $(seq 300); do
	curl -fs "http://127.0.0.1:$admin/config/" >/dev/null 2>&1 && break
	kill -0 "$caddy_pid" 2>/dev/null || { cat "$work/caddy.log" >&2; exit 1; }
	sleep 0.1
done

base=http://127.0.0.1:$http
"$work/soakload" -duration "${duration}s" -urls "$base/mem,$base/redis,$base/conc,$base/mem" >"$work/load.out" 2>&1 &
load_pid=$!

rss() { awk '/^VmRSS/ {print $2}' "/proc/$caddy_pid/status"; }
goroutines() { curl -fs "http://127.0.0.1:$admin/debug/pprof/goroutine?debug=1" | head -1 | awk '{print $NF}'; }
clients() { redis-cli -p "$rport" info clients 2>/dev/null | tr -d '\r' | awk -F: '/^connected_clients/ {print $2}'; }

echo "soak: ${duration}s, caddy $caddy, redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on 127.0.0.1:$rport; $(nproc) CPUs"
printf '%8s %10s %11s %14s %s\n' elapsed rss_kib goroutines redis_clients event
began=$(date +%s)
gen=0 restarted=0
while :; do
	sleep 10
	elapsed=$(($(date +%s) - began))
	# Sample first, then act: each line is the state 10 s after the
	# previous line's event.
	sample=$(printf '%8s %10s %11s %14s' "${elapsed}s" "$(rss)" "$(goroutines)" "$(clients)")
	if [ "$elapsed" -ge "$duration" ]; then
		echo "$sample end"
		break
	fi
	event=""
	if [ "$restarted" -eq 0 ] && [ "$elapsed" -ge $((duration / 2)) ]; then
		kill "$redis_pid"
		wait "$redis_pid" 2>/dev/null || true
		start_redis
		restarted=1 event=", then redis restarted"
	fi
	gen=$((gen + 1))
	config "$gen" >"$work/Caddyfile.$gen"
	if ! curl -fs -X POST -H 'Content-Type: text/caddyfile' --data-binary "@$work/Caddyfile.$gen" \
		"http://127.0.0.1:$admin/load" >/dev/null; then
		echo "reload $gen failed" >&2
		tail -20 "$work/caddy.log" >&2
		exit 1
	fi
	echo "$sample reload $gen$event"
done
wait "$load_pid" || true
load_pid=""
cat "$work/load.out"

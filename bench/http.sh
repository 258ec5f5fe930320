#!/usr/bin/env bash
# HTTP end-to-end throughput of the rate_limit handler: one Caddy serves
# three loopback sites, and wrk drives them in turn, so each limited site is
# compared with a plain one measured moments before under the same load.
#
#   plain  respond "ok"
#   allow  a token bucket so large it never refuses (the cost of admitting)
#   deny   one event a day: everything after the first request is a 429
#          (the cost of refusing, which must be cheap under a flood)
#
# Goals: allow >= 0.97 x plain, deny >= 0.95 x plain.
#
# Usage: bench/http.sh [rounds] [seconds per run]
# Env:   CONNS (default 32), THREADS (1), PIN (1: caddy on CPU 0, wrk on
#        CPU 1 with taskset when there are at least two CPUs; 0: no pinning),
#        CADDY_BIN (a prebuilt Caddy with Floodgate instead of go build),
#        PPROF (a directory: after the rounds, CPU profiles of Caddy while wrk
#        drives each site are written there, as plain.pprof, allow.pprof
#        and deny.pprof; the admin API then listens on a private loopback
#        port, since pprof is served there)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-5}
secs=${2:-5}
conns=${CONNS:-32}
threads=${THREADS:-1}
pin=${PIN:-1}

if ! command -v wrk >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi

work=$(mktemp -d)
caddy_pid=""
cleanup() {
	if [ -n "$caddy_pid" ]; then
		kill "$caddy_pid" 2>/dev/null || true
		wait "$caddy_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${CADDY_BIN:-}" ]; then
	cp "$CADDY_BIN" "$work/caddy"
else
	echo "== go build ./cmd/caddy"
	go build -o "$work/caddy" ./cmd/caddy
fi

# Free loopback ports, asked of the kernel.
read -r p_plain p_allow p_deny p_admin < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks: s.close()')

# No admin endpoint unless profiling, no access logs (Caddy writes none
# without a log directive), loopback only.
admin="admin off"
if [ -n "${PPROF:-}" ]; then admin="admin 127.0.0.1:$p_admin"; fi
cat >"$work/Caddyfile" <<CADDY
{
	$admin
	default_bind 127.0.0.1
	auto_https off
	persist_config off
}
http://:$p_plain {
	respond "ok"
}
http://:$p_allow {
	rate_limit {
		zone allow {
			key ip
			algorithm token_bucket
			rate 1000000000/s
		}
	}
	respond "ok"
}
http://:$p_deny {
	rate_limit {
		zone deny {
			key ip
			events 1
			window 24h
		}
	}
	respond "ok"
}
CADDY

caddy_cpu=() wrk_cpu=()
if [ "$pin" = 1 ] && command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
	caddy_cpu=(taskset -c 0)
	wrk_cpu=(taskset -c 1)
fi

HOME="$work" XDG_DATA_HOME="$work/data" XDG_CONFIG_HOME="$work/config" \
	"${caddy_cpu[@]}" "$work/caddy" run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.log" 2>&1 &
caddy_pid=$!
for port in "$p_plain" "$p_allow" "$p_deny"; do
	for _ in $(seq 100); do
		if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then break; fi
		if ! kill -0 "$caddy_pid" 2>/dev/null; then cat "$work/caddy.log"; exit 1; fi
		sleep 0.1
	done
done
# The deny site's one admission is spent by the readiness probe above.
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p_deny/")
[ "$code" = 429 ] || { echo "deny site answered $code, want 429"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p_allow/")
[ "$code" = 200 ] || { echo "allow site answered $code, want 200"; exit 1; }

# run SITE PORT DURATION: prints requests/s and the count of non-2xx.
run() {
	local out
	out=$("${wrk_cpu[@]}" wrk -t"$threads" -c"$conns" -d"$3"s "http://127.0.0.1:$2/")
	local rps non2xx
	rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	echo "$rps ${non2xx:-0}"
}

echo "== $(lscpu | grep 'Model name' | sed 's/  */ /g')"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t$threads -c$conns -d${secs}s, $rounds rounds, pinned: ${caddy_cpu[*]:-no} / ${wrk_cpu[*]:-no}"
for site in plain allow deny; do # warm up connections, caches and the heap
	port_var="p_$site"
	run "$site" "${!port_var}" 1 >/dev/null
done

declare -A results
printf '%-6s %12s %12s %12s %10s %12s %11s\n' round plain allow deny deny-429s allow/plain deny/plain
for r in $(seq "$rounds"); do
	row=()
	for site in plain allow deny; do
		port_var="p_$site"
		read -r rps non2xx < <(run "$site" "${!port_var}" "$secs")
		results[$site]+="$rps "
		row+=("$rps")
		if [ "$site" = allow ] && [ "$non2xx" != 0 ]; then
			echo "allow site refused $non2xx requests" >&2
			exit 1
		fi
		if [ "$site" = deny ]; then deny429=$non2xx; fi
	done
	ra=$(awk -v p="${row[0]}" -v a="${row[1]}" 'BEGIN {printf "%.3f", a/p}')
	rd=$(awk -v p="${row[0]}" -v d="${row[2]}" 'BEGIN {printf "%.3f", d/p}')
	results[ra]+="$ra "
	results[rd]+="$rd "
	printf '%-6s %12s %12s %12s %10s %12s %11s\n' "$r" "${row[@]}" "$deny429" "$ra" "$rd"
done

median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }
m_plain=$(median "${results[plain]}")
m_allow=$(median "${results[allow]}")
m_deny=$(median "${results[deny]}")
printf '%-6s %12s %12s %12s\n' median "$m_plain" "$m_allow" "$m_deny"
# Ratios of the medians, and medians of each round's ratios: the second
# compares runs made seconds apart, so it resists load from elsewhere.
awk -v p="$m_plain" -v a="$m_allow" -v d="$m_deny" 'BEGIN {
	printf "ratio of medians:  allow/plain %.3f (goal >= 0.97)   deny/plain %.3f (goal >= 0.95)\n", a/p, d/p
}'
echo "median of ratios:  allow/plain $(median "${results[ra]}")   deny/plain $(median "${results[rd]}")"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "${PPROF:-}" ]; then
	mkdir -p "$PPROF"
	for site in plain allow deny; do
		port_var="p_$site"
		run "$site" "${!port_var}" "$((secs + 2))" >/dev/null &
		wrk_pid=$!
		sleep 1
		curl -s -o "$PPROF/$site.pprof" "http://127.0.0.1:$p_admin/debug/pprof/profile?seconds=$secs"
		wait "$wrk_pid"
		echo "== profile: $PPROF/$site.pprof (go tool pprof -top $work/caddy ... ; the binary is kept as $PPROF/caddy)"
	done
	cp "$work/caddy" "$PPROF/caddy"
fi

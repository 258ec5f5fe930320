#!/usr/bin/env bash
# HTTP end-to-end cost of the rate_limit handler: one Caddy serves six
# loopback sites and wrk drives them in turn, round after round, each
# round starting one site later, so each limited site is compared with a
# plain one measured seconds apart, under the same load from elsewhere.
#
#   plain  respond "ok"
#   same   the same as plain on a port of its own: its ratio to plain is
#          this machine's noise, what a handler that cost nothing would show
#   vars   `vars` before the respond: Caddy's cheapest built-in handler (it
#          sets one request variable), for what one more handler in the
#          chain costs before it does any work of its own
#   allow  a token bucket so large it never refuses (the cost of admitting)
#   deny   one event a day: everything after the first request is a 429
#          (the cost of refusing, which must stay cheap under a flood)
#   error  `error 429` and no rate_limit: Caddy's own path for a handler
#          that returns an error, which every refusal takes (so that
#          handle_errors can render it); a reference, not a goal
#
# Goals: allow >= 0.97 x plain, deny >= 0.95 x plain.
#
# Two measures: requests/s, and Caddy's CPU time per request (user + system,
# all threads, from /proc). On a shared machine requests/s swings with what
# else runs; CPU per request barely does, and plain µs / site µs is the
# throughput ratio a CPU-bound Caddy would show. The last summary line
# divides by the mean of plain's and same's CPU per request in the same
# round instead: the baseline measured twice, so half as exposed to a
# single run's noise.
#
# Usage: bench/http.sh [rounds] [seconds per run]
# Env:   CONNS (default 32), THREADS (1), PIN (1: caddy on CPU 0, wrk on
#        CPU 1 with taskset when there are at least two CPUs; 0: no pinning),
#        CADDY_BIN (a prebuilt Caddy with Floodgate instead of go build),
#        PPROF (a directory: after the rounds, CPU profiles of Caddy while wrk
#        drives each site are written there as <site>.pprof, with the binary;
#        the admin API then listens on a private loopback port for pprof)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-5}
secs=${2:-5}
conns=${CONNS:-32}
threads=${THREADS:-1}
pin=${PIN:-1}
sites=(plain same vars allow deny error)

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

# Free loopback ports, asked of the kernel: one per site and the admin's.
declare -A port
read -r port[plain] port[same] port[vars] port[allow] port[deny] port[error] p_admin < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(7)]
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
http://:${port[plain]} {
	respond "ok"
}
http://:${port[same]} {
	respond "ok"
}
http://:${port[vars]} {
	vars reference 1
	respond "ok"
}
http://:${port[allow]} {
	rate_limit {
		zone allow {
			key ip
			algorithm token_bucket
			rate 1000000000/s
		}
	}
	respond "ok"
}
http://:${port[deny]} {
	rate_limit {
		zone deny {
			key ip
			events 1
			window 24h
		}
	}
	respond "ok"
}
http://:${port[error]} {
	error 429
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
for site in "${sites[@]}"; do
	for _ in $(seq 100); do
		if curl -s -o /dev/null "http://127.0.0.1:${port[$site]}/" 2>/dev/null; then break; fi
		if ! kill -0 "$caddy_pid" 2>/dev/null; then cat "$work/caddy.log"; exit 1; fi
		sleep 0.1
	done
done
# The deny site's one admission is spent by the readiness probe above.
for want in deny:429 allow:200 plain:200 same:200 vars:200 error:429; do
	code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port[${want%%:*}]}/")
	[ "$code" = "${want#*:}" ] || { echo "${want%%:*} site answered $code, want ${want#*:}"; exit 1; }
done

# cpu_ticks: user + system CPU time Caddy has used, all threads, in ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$caddy_pid/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))

# run PORT DURATION: prints requests/s, the count of non-2xx responses, and
# Caddy's CPU time per request in µs.
run() {
	local out t0 t1
	t0=$(cpu_ticks)
	out=$("${wrk_cpu[@]}" wrk -t"$threads" -c"$conns" -d"$2"s "http://127.0.0.1:$1/")
	t1=$(cpu_ticks)
	awk -v ticks="$((t1 - t0))" -v tick_us="$tick_us" '
		/^Requests\/sec:/ {rps = $2}
		/ requests in / {n = $1}
		/Non-2xx or 3xx responses:/ {non2xx = $5}
		END {printf "%s %d %.2f\n", rps, non2xx, n ? ticks * tick_us / n : 0}' <<<"$out"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(nproc) CPUs"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t$threads -c$conns -d${secs}s per run, $rounds rounds of ${sites[*]}; pinned: ${caddy_cpu[*]:-no} (caddy) / ${wrk_cpu[*]:-no} (wrk)"
for site in "${sites[@]}"; do # warm up connections, caches and the heap
	run "${port[$site]}" 1 >/dev/null
done

declare -A all
printf '%-6s %9s %9s %9s %9s %9s %9s | %8s %8s %8s %8s %8s %8s | %6s %6s %6s %6s %6s\n' \
	round 'plain/s' 'same/s' 'vars/s' 'allow/s' 'deny/s' 'error/s' 'plain µs' 'same µs' 'vars µs' 'allow µs' 'deny µs' 'error µs' s/p v/p a/p d/p e/p
for r in $(seq "$rounds"); do
	declare -A rps=() cpu=()
	# Each round starts one site later than the last, so no site always
	# follows the same one (the error site's garbage, say) or runs first.
	order=("${sites[@]:$(((r - 1) % ${#sites[@]}))}" "${sites[@]:0:$(((r - 1) % ${#sites[@]}))}")
	for site in "${order[@]}"; do
		read -r rps[$site] non2xx cpu[$site] < <(run "${port[$site]}" "$secs")
		all[rps_$site]+="${rps[$site]} "
		all[cpu_$site]+="${cpu[$site]} "
		case $site in
		plain | same | vars | allow) [ "$non2xx" = 0 ] || { echo "$site site answered $non2xx non-2xx" >&2; exit 1; } ;;
		*) [ "$non2xx" -gt 0 ] || { echo "$site site answered no 429" >&2; exit 1; } ;;
		esac
	done
	row=()
	for site in same vars allow deny error; do
		row+=("$(ratio "${rps[$site]}" "${rps[plain]}")")
		all[rr_$site]+="${row[-1]} "
		all[cr_$site]+="$(ratio "${cpu[plain]}" "${cpu[$site]}") "
		# Against both plain sites' mean: the baseline measured twice.
		all[cb_$site]+="$(awk -v a="${cpu[plain]}" -v b="${cpu[same]}" -v c="${cpu[$site]}" 'BEGIN {printf "%.3f", (a + b) / 2 / c}') "
	done
	printf '%-6s %9s %9s %9s %9s %9s %9s | %8s %8s %8s %8s %8s %8s | %6s %6s %6s %6s %6s\n' "$r" \
		"${rps[plain]}" "${rps[same]}" "${rps[vars]}" "${rps[allow]}" "${rps[deny]}" "${rps[error]}" \
		"${cpu[plain]}" "${cpu[same]}" "${cpu[vars]}" "${cpu[allow]}" "${cpu[deny]}" "${cpu[error]}" "${row[@]}"
done

printf '%-6s %9s %9s %9s %9s %9s %9s | %8s %8s %8s %8s %8s %8s\n' median \
	"$(median "${all[rps_plain]}")" "$(median "${all[rps_same]}")" "$(median "${all[rps_vars]}")" "$(median "${all[rps_allow]}")" "$(median "${all[rps_deny]}")" "$(median "${all[rps_error]}")" \
	"$(median "${all[cpu_plain]}")" "$(median "${all[cpu_same]}")" "$(median "${all[cpu_vars]}")" "$(median "${all[cpu_allow]}")" "$(median "${all[cpu_deny]}")" "$(median "${all[cpu_error]}")"
echo
echo "                                   same/plain  vars/plain  allow/plain  deny/plain  error/plain"
for m in rps:"requests/s, ratio of medians" rr:"requests/s, median of ratios" cr:"CPU/request, median of ratios" cb:"CPU/req. vs plain+same, median"; do
	key=${m%%:*}
	printf '%-32s' "${m#*:}"
	for site in same vars allow deny error; do
		case $key in
		rps) v=$(ratio "$(median "${all[rps_$site]}")" "$(median "${all[rps_plain]}")") ;;
		*) v=$(median "${all[${key}_$site]}") ;;
		esac
		printf '  %11s' "$v"
	done
	echo
done
echo "goals: allow/plain >= 0.97, deny/plain >= 0.95 (CPU ratio = plain µs / site µs)"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "${PPROF:-}" ]; then
	mkdir -p "$PPROF"
	cp "$work/caddy" "$PPROF/caddy"
	for site in "${sites[@]}"; do
		run "${port[$site]}" "$((secs + 2))" >/dev/null &
		wrk_pid=$!
		sleep 1
		curl -s -o "$PPROF/$site.pprof" "http://127.0.0.1:$p_admin/debug/pprof/profile?seconds=$secs"
		wait "$wrk_pid"
	done
	echo "== profiles: go tool pprof -top $PPROF/caddy $PPROF/<site>.pprof"
fi

#!/usr/bin/env bash
# HTTP end-to-end cost of the rate_limit handler: one Caddy serves nine
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
#   counted  allow's zone with `count_response { status 401 }`: every
#          response is a 200, which does not count, so each request takes
#          its unit up front and gives it back once answered (the cost of
#          watching the response); judged against allow
#   deny   one event a day: everything after the first request is a 429
#          (the cost of refusing, which must stay cheap under a flood)
#   error  `error 429` and no rate_limit: Caddy's own path for a handler
#          that returns an error, which every refusal takes (so that
#          handle_errors can render it); a reference, not a goal
#   fields   plain with Caddy's `header` writing the fields an admitting
#          zone writes (X-RateLimit-*, RateLimit, RateLimit-Policy): what
#          the required fields cost without any limiting, the reference the
#          handler's own cost is judged against (allow / fields)
#   error_fields  `error 429` with the same fields and Retry-After: the
#          same for a refusal (deny / error_fields)
#   redis_plain  allow's bucket with `store redis` and no local_quota: one
#          script call (EVALSHA) per request, a reference
#   redis_lease  the same with `local_quota 0.1`: units taken from Redis
#          ahead of requests and spent in memory (one client, one key)
#   redis_deny   deny's limit with `store redis` (deny_cache at its default
#          1s): Redis refuses once a second, memory repeats the refusal
#
# The Redis sites use one redis-server this script starts on a free
# loopback port (no persistence) and stops on exit. Their redis block has
# `timeout 100ms` rather than the default 5ms, so that a scheduling hiccup
# on a busy shared CPU is not taken for an outage; redis_plain and
# redis_lease `fail closed` (a failure is a 503, which the script rejects)
# and redis_deny `fail open` (a failure is a 200, which it rejects too).
#
# Goals: allow >= 0.97 x plain, deny >= 0.95 x plain,
#        redis_lease >= 0.85 x plain, redis_deny >= 0.90 x plain,
#        counted >= 0.97 x allow (CPU per request within 3% of the same
#        zone without count_response).
#
# Two measures: requests/s, and CPU time per request: Caddy's (user +
# system, all threads, from /proc) plus redis-server's, read the same way
# for every site (on the sites that do not use it, Redis idles). On a shared
# machine requests/s swings with what else runs; CPU per request barely
# does, and plain µs / site µs is the throughput ratio a CPU-bound server
# would show. The "vs plain+same" summary line, by which the goals are
# judged, divides by the mean of plain's and same's CPU per request in the
# same round instead: the baseline measured twice, so half as exposed to a
# single run's noise.
#
# Usage: bench/http.sh [rounds] [seconds per run]
# Env:   CONNS (default 32), THREADS (1), PIN (1: caddy and redis-server on
#        CPU 0, wrk on CPU 1 with taskset when there are at least two CPUs;
#        0: no pinning),
#        CADDY_BIN (a prebuilt Caddy with Floodgate instead of go build),
#        SITES (the sites to measure and their order, space-separated;
#        default: all, in the order plain same vars allow counted deny
#        redis_plain redis_lease redis_deny error fields error_fields;
#        plain and same are
#        required (and allow, for counted); a
#        Redis site not listed is not configured at all),
#        SUMMARY (a file: the medians and ratios to plain per site are
#        written there as TSV, for bench/chart),
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
summary=${SUMMARY:-}
all_sites=(plain same vars allow counted deny redis_plain redis_lease redis_deny error fields error_fields)
# In the default order plain follows error, as before the Redis sites came
# (the rotation keeps each site's neighbours).
read -r -a sites <<<"${SITES:-${all_sites[*]}}"
# What each site must answer: 200 to every request, or 429 to every one.
declare -A want=([plain]=200 [same]=200 [vars]=200 [allow]=200 [counted]=200 [deny]=429 [error]=429
	[redis_plain]=200 [redis_lease]=200 [redis_deny]=429 [fields]=200 [error_fields]=429)
others=() # every site measured but plain, each compared with it
for site in "${sites[@]}"; do
	[ -n "${want[$site]:-}" ] || { echo "unknown site $site (sites: ${all_sites[*]})" >&2; exit 1; }
	[ "$site" = plain ] || others+=("$site")
done
[[ " ${sites[*]} " == *" plain "* && " ${sites[*]} " == *" same "* ]] || { echo "SITES must include plain and same" >&2; exit 1; }

command -v redis-server >/dev/null || { echo "redis-server is not on PATH" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "redis-cli is not on PATH" >&2; exit 1; }
if ! command -v wrk >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi

work=$(mktemp -d)
caddy_pid="" redis_pid=""
cleanup() {
	local pid
	for pid in $caddy_pid $redis_pid; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${CADDY_BIN:-}" ]; then
	cp "$CADDY_BIN" "$work/caddy"
else
	echo "== go build ./cmd/caddy"
	go build -o "$work/caddy" ./cmd/caddy
fi

# Free loopback ports, asked of the kernel: one per site, the admin's and
# redis-server's.
declare -A port
read -r -a ports < <(python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks: s.close()' $((${#all_sites[@]} + 2)))
for i in "${!all_sites[@]}"; do port[${all_sites[$i]}]=${ports[$i]}; done
p_admin=${ports[-2]} p_redis=${ports[-1]}

caddy_cpu=() wrk_cpu=()
if [ "$pin" = 1 ] && command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
	caddy_cpu=(taskset -c 0)
	wrk_cpu=(taskset -c 1)
fi

# redis-server shares Caddy's CPU, not wrk's: the server side (Caddy and
# the Redis it asks) then competes for one CPU, as the CPU-per-request
# measure counts both, and the load generator keeps the other CPU to
# itself, so a Redis site cannot look faster by taking wrk's time.
"${caddy_cpu[@]}" redis-server --port "$p_redis" --bind 127.0.0.1 --save '' --appendonly no \
	--dir "$work" --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 200); do
	redis-cli -h 127.0.0.1 -p "$p_redis" ping >/dev/null 2>&1 && break
	kill -0 "$redis_pid" 2>/dev/null || { cat "$work/redis.log" >&2; exit 1; }
	sleep 0.05
done

# No admin endpoint unless profiling, no access logs (Caddy writes none
# without a log directive), loopback only.
admin="admin off"
if [ -n "${PPROF:-}" ]; then admin="admin 127.0.0.1:$p_admin"; fi
# redis_site NAME FAIL LIMIT...: a site behind one Redis zone.
redis_site() {
	local name=$1 fail=$2
	shift 2
	printf 'http://:%s {\n\trate_limit {\n\t\tzone %s {\n\t\t\tkey ip\n' "${port[$name]}" "$name"
	printf '\t\t\t%s\n' "$@" "store redis" "fail $fail"
	printf '\t\t}\n\t\tredis {\n\t\t\taddresses 127.0.0.1:%s\n\t\t\ttimeout 100ms\n\t\t}\n\t}\n\trespond "ok"\n}\n' "$p_redis"
}
# redis_sites: the Redis sites measured, and only those, so a run of the
# memory sites alone measures the same Caddy as before the Redis sites
# came (three more handlers and their clients cost every site a little).
redis_sites() {
	local site
	for site in "${sites[@]}"; do
		case $site in
		redis_plain) redis_site redis_plain closed "algorithm token_bucket" "rate 1000000000/s" ;;
		redis_lease) redis_site redis_lease closed "algorithm token_bucket" "rate 1000000000/s" "local_quota 0.1" ;;
		redis_deny) redis_site redis_deny open "events 1" "window 24h" ;;
		esac
	done
}
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
http://:${port[counted]} {
	rate_limit {
		zone counted {
			key ip
			algorithm token_bucket
			rate 1000000000/s
			count_response {
				status 401
			}
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
http://:${port[fields]} {
	header X-RateLimit-Limit 1000000000
	header X-RateLimit-Remaining 999999999
	header X-RateLimit-Reset 1
	header RateLimit "\"allow\";r=999999999;t=1"
	header RateLimit-Policy "\"allow\";q=1000000000;w=1"
	respond "ok"
}
http://:${port[error_fields]} {
	header X-RateLimit-Limit 1
	header X-RateLimit-Remaining 0
	header X-RateLimit-Reset 86399
	header RateLimit "\"deny\";r=0;t=86399"
	header RateLimit-Policy "\"deny\";q=1;w=86400"
	header Retry-After 86399
	error 429
}
$(redis_sites)
CADDY

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
# The deny sites' one admission is spent by the readiness probe above.
for site in "${sites[@]}"; do
	code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${port[$site]}/")
	[ "$code" = "${want[$site]}" ] || { echo "$site site answered $code, want ${want[$site]}"; cat "$work/caddy.log"; exit 1; }
done

# ticks PID: user + system CPU time the process has used, all threads, in
# ticks (fields 14 and 15 of /proc/PID/stat, counted after the command
# name, which may hold spaces).
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
tick_us=$((1000000 / $(getconf CLK_TCK)))

# run PORT DURATION: prints requests/s, the count of requests, the count
# of non-2xx responses, and Caddy's and redis-server's CPU time per
# request in µs.
run() {
	local out c0 c1 r0 r1
	c0=$(ticks "$caddy_pid") r0=$(ticks "$redis_pid")
	out=$("${wrk_cpu[@]}" wrk -t"$threads" -c"$conns" -d"$2"s "http://127.0.0.1:$1/")
	c1=$(ticks "$caddy_pid") r1=$(ticks "$redis_pid")
	awk -v caddy="$((c1 - c0))" -v redis="$((r1 - r0))" -v tick_us="$tick_us" '
		/^Requests\/sec:/ {rps = $2}
		/ requests in / {n = $1}
		/Non-2xx or 3xx responses:/ {non2xx = $5}
		END {printf "%s %d %d %.2f %.2f\n", rps, n, non2xx, n ? caddy * tick_us / n : 0, n ? redis * tick_us / n : 0}' <<<"$out"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }

echo "== $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(nproc) CPUs; redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t$threads -c$conns -d${secs}s per run, $rounds rounds of ${sites[*]}; pinned: ${caddy_cpu[*]:-no} (caddy, redis-server) / ${wrk_cpu[*]:-no} (wrk)"
for site in "${sites[@]}"; do # warm up connections, caches and the heap
	run "${port[$site]}" 1 >/dev/null
done

# Column headings: sites shortened (redis_lease: r_lease) to keep rows short.
short() { sed 's/^redis_/r_/' <<<"$1"; }
declare -A all
echo "requests/s, then CPU µs per request (Caddy + redis-server), then requests/s ratio to plain, per round:"
printf '%-6s' round
for site in "${sites[@]}"; do printf ' %9s' "$(short "$site")/s"; done
printf ' |'
for site in "${sites[@]}"; do printf ' %8s' "$(short "$site")"; done
printf ' |'
for site in "${others[@]}"; do printf ' %7s' "$(short "$site")"; done
echo
for r in $(seq "$rounds"); do
	declare -A rps=() cpu=()
	# Each round starts one site later than the last, so no site always
	# follows the same one (the error site's garbage, say) or runs first.
	order=("${sites[@]:$(((r - 1) % ${#sites[@]}))}" "${sites[@]:0:$(((r - 1) % ${#sites[@]}))}")
	for site in "${order[@]}"; do
		read -r rps[$site] n non2xx caddy_us redis_us < <(run "${port[$site]}" "$secs")
		cpu[$site]=$(awk -v a="$caddy_us" -v b="$redis_us" 'BEGIN {printf "%.2f", a + b}')
		all[rps_$site]+="${rps[$site]} "
		all[cpu_$site]+="${cpu[$site]} "
		all[caddy_$site]+="$caddy_us "
		all[redis_$site]+="$redis_us "
		# Every response as expected: none refused (or failed) on an
		# admitting site, every one refused on a refusing site.
		case ${want[$site]} in
		200) [ "$non2xx" = 0 ] || { echo "$site site answered $non2xx non-2xx of $n" >&2; exit 1; } ;;
		*) [ "$non2xx" = "$n" ] || { echo "$site site answered $non2xx non-2xx of $n, want all" >&2; exit 1; } ;;
		esac
	done
	row=()
	for site in "${others[@]}"; do
		row+=("$(ratio "${rps[$site]}" "${rps[plain]}")")
		all[rr_$site]+="${row[-1]} "
		all[cr_$site]+="$(ratio "${cpu[plain]}" "${cpu[$site]}") "
		# Against both plain sites' mean: the baseline measured twice.
		all[cb_$site]+="$(awk -v a="${cpu[plain]}" -v b="${cpu[same]}" -v c="${cpu[$site]}" 'BEGIN {printf "%.3f", (a + b) / 2 / c}') "
		if [ "$site" = counted ] && [ -n "${cpu[allow]:-}" ]; then
			all[ca_counted]+="$(ratio "${cpu[allow]}" "${cpu[counted]}") "
		fi
	done
	printf '%-6s' "$r"
	for site in "${sites[@]}"; do printf ' %9s' "${rps[$site]}"; done
	printf ' |'
	for site in "${sites[@]}"; do printf ' %8s' "${cpu[$site]}"; done
	printf ' |'
	for v in "${row[@]}"; do printf ' %7s' "$v"; done
	echo
done

printf '%-6s' median
for site in "${sites[@]}"; do printf ' %9s' "$(median "${all[rps_$site]}")"; done
printf ' |'
for site in "${sites[@]}"; do printf ' %8s' "$(median "${all[cpu_$site]}")"; done
echo
echo
printf '%-32s' "CPU µs/request, median:"
for site in "${sites[@]}"; do printf ' %11s' "$site"; done
echo
for m in caddy:"  Caddy" redis:"  redis-server"; do
	printf '%-32s' "${m#*:}"
	for site in "${sites[@]}"; do printf ' %11s' "$(median "${all[${m%%:*}_$site]}")"; done
	echo
done
echo
printf '%-32s' "ratio to plain:"
for site in "${others[@]}"; do printf ' %11s' "$site"; done
echo
# value KEY SITE: one summary figure of site against plain.
value() {
	case $1 in
	rps) ratio "$(median "${all[rps_$2]}")" "$(median "${all[rps_plain]}")" ;;
	*) median "${all[${1}_$2]}" ;;
	esac
}
for m in rps:"requests/s, ratio of medians" rr:"requests/s, median of ratios" cr:"CPU/request, median of ratios" cb:"CPU/req. vs plain+same, median"; do
	printf '%-32s' "${m#*:}"
	for site in "${others[@]}"; do printf ' %11s' "$(value "${m%%:*}" "$site")"; done
	echo
done
echo "goals (CPU/req. vs plain+same; plain µs / site µs):"
for g in allow:0.97 deny:0.95 redis_lease:0.85 redis_deny:0.90; do
	site=${g%%:*} goal=${g#*:}
	[ -n "${all[cb_$site]:-}" ] || continue
	v=$(value cb "$site")
	printf '  %-12s >= %s: %s %s\n' "$site" "$goal" "$v" "$(awk -v v="$v" -v g="$goal" 'BEGIN {print (v >= g ? "met" : "MISSED")}')"
done
if [ -n "${all[ca_counted]:-}" ]; then
	v=$(median "${all[ca_counted]}")
	printf '  %-12s >= 0.97 x allow (CPU/req., median of ratios): %s %s\n' counted "$v" "$(awk -v v="$v" 'BEGIN {print (v >= 0.97 ? "met" : "MISSED")}')"
fi
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ -n "$summary" ]; then
	{
		printf 'site\trps\tcpu_us\tcaddy_us\tredis_us\trps_ratio\trps_ratio_rounds\tcpu_ratio_rounds\tcpu_ratio_base\n'
		printf 'plain\t%s\t%s\t%s\t%s\t1.000\t1.000\t1.000\t%s\n' "$(median "${all[rps_plain]}")" "$(median "${all[cpu_plain]}")" \
			"$(median "${all[caddy_plain]}")" "$(median "${all[redis_plain]}")" \
			"$(awk -v a="$(median "${all[cpu_plain]}")" -v b="$(median "${all[cpu_same]}")" 'BEGIN {printf "%.3f", (a + b) / 2 / a}')"
		for site in "${others[@]}"; do
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$site" "$(median "${all[rps_$site]}")" "$(median "${all[cpu_$site]}")" \
				"$(median "${all[caddy_$site]}")" "$(median "${all[redis_$site]}")" \
				"$(value rps "$site")" "$(value rr "$site")" "$(value cr "$site")" "$(value cb "$site")"
		done
	} >"$summary"
	echo "== summary: $summary"
fi

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

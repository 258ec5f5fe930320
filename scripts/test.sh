#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs redis-server,
# valkey-server, prometheus (for e2e's TestComingFromMholt), and node and
# npm (to run npm's ratelimit-header-parser on the header families,
# e2e/header_families_test.go) when missing, checks that both ways of
# building Caddy with Floodgate work, runs every Go test with the race
# detector against redis-server, then the packages that start a server
# again against valkey-server (FLOODGATE_REDIS_SERVER=valkey,
# internal/redistest).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
apt_updated=""
apt_install() {
	if [ -z "$apt_updated" ]; then $sudo apt-get update -qq; apt_updated=1; fi
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# backports_mirror prints the URI of the Debian archive that apt already
# uses for suite $1 (a deb822 entry in sources.list.d/*.sources whose
# Suites include it, or a one-line "deb <uri> $1 ..." in a *.list file), so
# the backports suite comes from the same mirror and no host name is
# written here.
backports_mirror() {
	local suite=$1 f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -e "$f" ] || continue
		awk -v suite="$suite" '
			function flush() {
				if (enabled && deb && has && uri != "") { print uri; found = 1; exit }
				enabled = 1; deb = 0; has = 0; uri = ""
			}
			BEGIN { enabled = 1 }
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			{
				key = tolower($1); sub(/:$/, "", key)
				if (key == "types") for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1
				if (key == "suites") for (i = 2; i <= NF; i++) if ($i == suite) has = 1
				if (key == "uris") uri = $2
				if (key == "enabled" && tolower($2) == "no") enabled = 0
			}
			END { if (!found) flush() }' "$f" | head -n1 | grep . && return 0
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -e "$f" ] || continue
		# deb [options] <uri> <suite> <components>...
		sed -n -E "s/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+$suite[[:space:]].*/\2/p" "$f" |
			head -n1 | grep . && return 0
	done
	return 1
}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	apt_install redis-server redis-tools
fi

# Prometheus: e2e/coming_from_mholt_test.go evaluates the queries and
# alerting rules of docs/coming-from-mholt.md with a real one (Debian 12's
# package is 19 MB). Its recommended node exporter is not needed.
if ! command -v prometheus >/dev/null 2>&1; then
	apt_install --no-install-recommends prometheus
fi

# Valkey: in Debian 12 only in bookworm-backports. When apt knows no
# valkey-server, enable <codename>-backports from the mirror apt already
# uses, then install from there.
if ! command -v valkey-server >/dev/null 2>&1 || ! command -v valkey-cli >/dev/null 2>&1; then
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	if [ -z "$apt_updated" ]; then $sudo apt-get update -qq; apt_updated=1; fi
	target=()
	if ! apt-cache policy valkey-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
		[ -n "$codename" ] || { echo "valkey-server: apt has none and /etc/os-release names no codename" >&2; exit 1; }
		mirror=$(backports_mirror "$codename") ||
			{ echo "valkey-server: apt has none, and no apt source for $codename names a mirror to take $codename-backports from" >&2; exit 1; }
		echo "== enabling $codename-backports from $mirror for valkey-server"
		printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
			"$mirror" "$codename" | $sudo tee /etc/apt/sources.list.d/floodgate-backports.sources >/dev/null
		$sudo apt-get update -qq
		target=(-t "$codename-backports")
	fi
	apt_install "${target[@]}" valkey-server valkey-tools
fi

# node and npm: e2e's TestHeaderParserReads installs npm's
# ratelimit-header-parser (pinned in e2e/testdata/ratelimit-header-parser)
# into the user's cache and runs it with node.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	apt_install nodejs npm
fi

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
module=github.com/floodgatehq/caddy-ratelimit

echo "== build: go build ./cmd/caddy"
go build -o "$bin/caddy" ./cmd/caddy
# grep reads the whole listing (no -q): stopping at the first match would
# leave Caddy writing into a closed pipe, and pipefail would fail on it.
"$bin/caddy" list-modules | grep -x http.handlers.rate_limit >/dev/null

echo "== build: go tool xcaddy build --with $module"
(cd tools && go tool xcaddy build --output "$bin/xcaddy-caddy" \
	--with "$module@v0.0.0-00010101000000-000000000000=..") >"$bin/xcaddy.log" 2>&1 ||
	{ cat "$bin/xcaddy.log"; exit 1; }
"$bin/xcaddy-caddy" list-modules | grep -x http.handlers.rate_limit >/dev/null

echo "== go test -race ./... ($(redis-server --version | sed -E 's/.*v=([^ ]*).*/redis-server \1/'))"
# Integration tests start the binary built above rather than building their own.
export FLOODGATE_CADDY_BIN="$bin/caddy"
go test -race -count=1 -timeout 25m ./...

# The packages whose tests start a server (they import internal/redistest),
# again against Valkey.
echo "== go test -race ./limiter/... ./e2e/ ./internal/redistest/ ($(valkey-server --version | sed -E 's/.*v=([^ ]*).*/valkey-server \1/'), FLOODGATE_REDIS_SERVER=valkey)"
FLOODGATE_REDIS_SERVER=valkey go test -race -count=1 -timeout 25m ./limiter/... ./e2e/ ./internal/redistest/

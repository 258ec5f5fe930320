#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs redis-server when missing,
# checks that both ways of building Caddy with Floodgate work, then runs
# every Go test with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
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

echo "== go test -race ./..."
# Integration tests start the binary built above rather than building their own.
export FLOODGATE_CADDY_BIN="$bin/caddy"
go test -race -count=1 -timeout 25m ./...

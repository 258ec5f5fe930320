// Package e2e holds Floodgate's end-to-end tests: every test that runs a
// Caddy built with Floodgate as a process (internal/caddyproc), with a
// redis-server (internal/redistest) behind it where a zone keeps its state
// in Redis. Other packages' tests never run Caddy, and start redis-server
// only to test the Redis store itself (limiter/) or the harness that runs
// it. The package has no code of its own; its tests see the product as an
// operator does, through a Caddyfile or JSON config in and HTTP, the admin
// API, `caddy rate-limit`, /metrics and the logs out. They import neither
// the root package nor limiter, so what they check is what a user can rely
// on, and a figure a test needs, such as the hash that names a key, is
// computed the way the docs document it.
//
// One harness serves them all: harness_test.go runs Caddy and sends
// requests, harness_redis_test.go builds redis sites and reads Redis as
// redis-cli would, headers_test.go parses and checks the rate-limit
// fields. Each test runs its own Caddy on its own loopback ports, in
// parallel; limits that must hold are set over minutes or hours, and the
// tests that measure time allow for a small, shared machine.
//
// Run them with the rest of the suite (./scripts/test.sh), or alone:
//
//	go build -o /tmp/caddy ./cmd/caddy
//	FLOODGATE_CADDY_BIN=/tmp/caddy go test -race ./e2e/
//
// Without FLOODGATE_CADDY_BIN the harness builds ./cmd/caddy once per run.
// Without redis-server on the PATH the tests that need it are skipped,
// unless CI=true, where they fail; so is the test of
// docs/coming-from-mholt.md without prometheus, which evaluates the
// page's queries, and TestHeaderParserReads without node and npm, with
// which it installs npm's ratelimit-header-parser. The fast unit tests are the other
// packages': go test . ./limiter/ ./internal/...
package e2e

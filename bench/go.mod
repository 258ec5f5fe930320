module github.com/floodgatehq/caddy-ratelimit/bench

go 1.26.0

require (
	github.com/floodgatehq/caddy-ratelimit v0.0.0
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// The bench measures the code in this tree, not a published version.
replace github.com/floodgatehq/caddy-ratelimit => ..

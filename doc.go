// Package ratelimit is Floodgate: the Caddy HTTP handler
// http.handlers.rate_limit, which limits requests per zone with the
// algorithms and stores of the limiter package.
package ratelimit

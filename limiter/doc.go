// Package limiter decides whether a request may pass a rate limit. It knows
// nothing of Caddy or HTTP: a Policy describes a limit, a Store keeps the
// state of every key under one Policy, and each decision is a Decision from
// which response headers can be computed without further lookups.
//
// This package holds the policies, the algorithms, the memory store (Memory)
// and the interfaces every store implements. The Redis store is package
// limiter/redisstore and the near cache in front of it limiter/nearcache;
// both depend on this package only through its exported names (Compile,
// NewAdmission), never the other way round.
//
// Time is read from an injected Clock (memory store) or from the server
// (Redis), in whole microseconds. The algorithms use exact integer
// arithmetic: token and leaky bucket state is kept in time scaled by the
// policy's events, so one unit costs exactly Window and no float rounding
// can grant or refuse a request that sits on a limit.
package limiter

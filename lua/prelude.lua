-- prelude.lua: the start of every script. limiter/redis.go sends it in
-- front of the algorithm's own file as one script, so a decision is still a
-- single atomic EVALSHA; what every algorithm needs is written once, here.
--
-- ARGV[1..6]: op ("take" | "return"), cost, now (µs, "" = Redis TIME), ttl
-- pad (ms, 0 outside tests), L, W. Further arguments are the algorithm's.
--
-- The scripts run on every request and the interpreter is most of their
-- cost, so they are written straight through, with few function calls.

local op, cost, pad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local l, w = tonumber(ARGV[5]), tonumber(ARGV[6])

local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

-- Integer division: floor(a / d) and ceil(a / d) are exact. Every quantity
-- a script forms is an integer a with |a| < 2^53 (limiter/redis.go refuses
-- policies that would leave that range) and d >= 1 is an integer. Rounding
-- moves the double a / d by at most |a / d|×2^-53 < 1/d, while an a / d that
-- is not an integer lies at least 1/d from every integer: the rounded
-- quotient never crosses one. Locals, not helper functions: a function
-- defined here would be created anew on every call, and calls are where the
-- interpreter spends most.
local floor, ceil = math.floor, math.ceil

-- prelude.lua: the start of every script. lua.Script puts it in
-- front of the algorithm's own file as one script, so a decision is still a
-- single atomic EVALSHA; what every algorithm needs is written once, here.
--
-- ARGV[1..4]: cost (units to take; negated, units to give back; 0, none:
-- the state as it stands; "c" and a count, units to charge: taken whether
-- or not the limit has them, limiter's Charge, in the scripts of the
-- algorithms that can owe), now (µs; "" = Redis TIME; "i" and µs = the
-- instance's clock where the server refuses TIME; a bare number = a test's
-- clock), L, W. Further arguments are the algorithm's. A test that sets now
-- also steps it far from the wall clock, so its keys live 10 minutes longer
-- than their state needs (pad, in ms; see RedisOptions.Clock in
-- limiter/redis.go).
--
-- The scripts run on every request and the interpreter is most of their
-- cost, so they are written straight through, with few function calls and
-- few arguments: each one is a string Redis parses and Lua interns.

local cost, op = tonumber(ARGV[1]), 'take'
if not cost then
  cost, op = tonumber(string.sub(ARGV[1], 2)), 'charge'
elseif cost <= 0 then
  -- A cost of 0 gives nothing back: a look at the state (limiter's Peek).
  cost, op = -cost, 'return'
end
local l, w = tonumber(ARGV[3]), tonumber(ARGV[4])

local now, pad = tonumber(ARGV[2]), 0
if now then
  pad = 600000
elseif ARGV[2] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  -- "i" and µs: the instance's clock, on a server that refuses TIME in
  -- scripts (time_probe.lua). Instances' clocks differ by their skew, so
  -- keys live a second longer than their state needs, for an instance
  -- whose clock is behind the one that wrote them.
  now, pad = tonumber(string.sub(ARGV[2], 2)), 1000
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
-- unpack is a global in Lua 5.1 (Redis, Valkey) and table.unpack in Lua 5.4
-- (Dragonfly and others): the scripts use only what both versions have
-- (limiter/lua_portability_test.go), and this one name through a local.
local unpack = table.unpack or unpack

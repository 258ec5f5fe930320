-- prelude.lua: the start of every script. lua.Script puts it in
-- front of the algorithm's own file as one script, so a decision is still a
-- single atomic EVALSHA; what every algorithm needs is written once, here.
--
-- ARGV[1..4]: cost (units to take; negated, units to give back; 0, none:
-- the state as it stands; "c" and a count, units to charge: taken whether
-- or not the limit has them, limiter's Charge, in the scripts of the
-- algorithms that can owe), now (µs; "" = Redis TIME; "i" and µs = the
-- instance's clock where the server refuses TIME; a bare number = a test's
-- clock), L, W. Further arguments are the algorithm's. Every TTL a script
-- sets is the state's end plus pad (ms): see below.
--
-- The epoch: every algorithm's state but concurrency's (whose slots name
-- themselves) stores an epoch, a number below 2^53 that names it among
-- every state the key has had: an admin reset deletes the state, and the
-- next take makes one with another epoch. It is an argument of every call,
-- after the algorithm's own and before a give-back's admission time or a
-- lease's want: for a take, a lease or a charge, a random epoch the
-- instance drew, which the state takes only if this call makes it (no
-- clock is involved, so instances on different clocks, or a test's clock
-- that stands still, cannot give two states one epoch); for a give-back,
-- the epoch of the state that took the units (limiter.Receipt.Epoch), and
-- the units are given back only if the key's state has it: one a reset
-- began since never counted them. A give-back's epoch "0" names no state
-- and gives back to any. Every reply ends with the state's epoch (0 for a
-- key that holds none), which the instance keeps in the admission's
-- receipt.
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

-- pad: keys live a second (the skew docs/redis.md allows between instances)
-- longer than their state needs on the clock that wrote them, whichever
-- clock that is. Instances on the instance's clock (a server that refuses
-- TIME to some of them, or for a while after it allows TIME again, to
-- those that have not probed since) decide beside instances on Redis's:
-- a key that expired at its state's end on the writer's clock would be
-- gone for an instance whose clock is behind and still inside that state,
-- which would start it afresh (a filled window admitted again). A test
-- that sets now steps it far from the wall clock, so its keys live 10
-- minutes longer (see RedisOptions.Clock in limiter/redis.go).
local now, pad = tonumber(ARGV[2]), 1000
if now then
  pad = 600000
elseif ARGV[2] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  -- "i" and µs: the instance's clock, on a server that refuses TIME in
  -- scripts (time_probe.lua).
  now = tonumber(string.sub(ARGV[2], 2))
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

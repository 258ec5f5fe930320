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
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Floor division exact for |a| < 2^53: the double quotient is off by at most one.
local function fdiv(a, d)
  if d == 1 then
    return a
  end
  local q = math.floor(a / d)
  local r = a - q * d
  if r < 0 then
    q = q - 1
  elseif r >= d then
    q = q + 1
  end
  return q
end

local function cdiv(a, d)
  if a <= 0 then
    return 0
  end
  return fdiv(a + d - 1, d)
end

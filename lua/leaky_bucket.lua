-- leaky_bucket.lua: the leaky bucket of DESIGN.md section 4 by virtual
-- scheduling, decided exactly as limiter/leaky_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the queue
-- is empty, in µs plus frac < L in units of 1/L µs. In time scaled by L one
-- unit of work costs exactly W. See encode for how tat and frac are packed
-- into one integer.
--
-- ARGV: op ("take" | "return"), cost, now (µs, "" = Redis TIME), ttl pad (ms,
-- 0 outside tests), L, W, max_delay (µs scaled by L), max ahead (µs). L, W and
-- max_delay arrive divided by the greatest common divisor of L and W.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs};
-- on an admission retry_after is how long the request is held.

local op, cost, pad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local l, w, maxdelay, ahead = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Floor division exact for |a| < 2^53: the double quotient is off by at most one.
local function fdiv(a, d)
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

-- The state is the one integer tat×L + frac, which Redis keeps in the 8
-- bytes of an integer-encoded string (while below 2^63, i.e. for L up to a
-- few thousand), so a key costs no more than one holding a plain counter.
-- Doubles cannot hold it exactly, so it is handled in 9-digit halves: exact
-- while L×10^9 < 2^53. Beyond that the state is written as "<tat>:<frac>".
-- The key's name carries L (see limiter/redis.go), so a value is never read
-- with another L than it was written with.
local E9 = 1000000000
local packed = l * E9 < 9007199254740992

local function encode(tat, frac)
  if not packed then
    return string.format('%d:%d', tat, frac)
  end
  local th = fdiv(tat, E9)
  local low = (tat - th * E9) * l + frac
  local carry = fdiv(low, E9)
  local high = th * l + carry
  low = low - carry * E9
  if high == 0 then
    return string.format('%d', low)
  end
  return string.format('%d%09d', high, low)
end

local function decode(v)
  local sep = string.find(v, ':', 1, true)
  if sep then
    return tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  end
  local n = #v
  local hi, lo = 0, tonumber(v)
  if n > 9 then
    hi, lo = tonumber(string.sub(v, 1, n - 9)), tonumber(string.sub(v, n - 8))
  end
  -- hi×10^9 + lo = (qh×10^9 + ql)×L + frac, by long division.
  local qh = fdiv(hi, l)
  local rest = (hi - qh * l) * E9 + lo
  local ql = fdiv(rest, l)
  return qh * E9 + ql, rest - ql * l
end

-- The queued wait: how far tat lies ahead of now, scaled by L.
local wait = 0
local v = redis.call('GET', KEYS[1])
if v then
  local tat, frac = decode(v)
  local d = tat - now
  if d >= 0 then
    -- A clock stepped backwards must not leave tat unboundedly ahead.
    if d > ahead then
      d = ahead
    end
    wait = d * l + frac
  end
end

local function save(x)
  if x <= 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local q = fdiv(x, l)
  redis.call('SET', KEYS[1], encode(now + q, x - q * l), 'PX', cdiv(x, l * 1000) + pad)
end

-- Free queue slots for unit requests.
local function remaining(x)
  if x > maxdelay then
    return 0
  end
  return fdiv(maxdelay - x, w) + 1
end

if op == 'return' then
  wait = math.max(0, wait - cost * w)
  save(wait)
  return {1, remaining(wait), cdiv(wait, l), 0, now}
end

if wait > maxdelay then
  return {0, 0, cdiv(wait, l), cdiv(wait - maxdelay, l), now}
end
local debt = wait + cost * w
save(debt)
return {1, remaining(debt), cdiv(debt, l), cdiv(wait, l), now}

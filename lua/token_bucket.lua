-- token_bucket.lua: the token bucket of DESIGN.md section 4, decided exactly
-- as limiter/token_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, the moment the
-- bucket is full again, in µs plus frac < L in units of 1/L µs. Time scaled
-- by L makes one unit cost exactly W, so every quantity below is an integer.
-- tat and frac are packed into the one integer tat×L + frac, which Redis
-- keeps in the 8 bytes of an integer-encoded string (while below 2^63, i.e.
-- for L up to a few thousand), so a key costs no more than a plain counter.
-- Doubles cannot hold that integer exactly, so it is split into 9-digit
-- halves: exact while L×10^9 < 2^53; beyond that the state is written as
-- "<tat>:<frac>". The key's name carries L (see limiter/redis.go), so a value
-- is never read with another L than it was written with.
--
-- ARGV: op ("take" | "return"), cost, now (µs, "" = Redis TIME), ttl pad (ms,
-- 0 outside tests), L, W, B, max ahead (µs). L and W arrive divided by their
-- greatest common divisor, which changes no decision and keeps products small.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs}.
--
-- The script runs on every request and the interpreter is most of its cost,
-- so it is written straight through: two helper functions, and no packing
-- arithmetic when L is 1, as it is for most policies (100/1m, 5/s, ...).

local cost, pad = tonumber(ARGV[2]), tonumber(ARGV[4])
local l, w, b, ahead = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

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

local E9 = 1000000000
local packed = l * E9 < 9007199254740992

-- debt = (B - tokens) × W: how far tat lies ahead of now, scaled by L.
local debt = 0
local v = redis.call('GET', KEYS[1])
if v then
  local tat, frac = tonumber(v), 0
  if l ~= 1 then
    local sep = string.find(v, ':', 1, true)
    if sep then
      tat, frac = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
    else
      -- hi×10^9 + lo = (qh×10^9 + ql)×L + frac, by long division.
      local n, hi, lo = #v, 0, tat
      if n > 9 then
        hi, lo = tonumber(string.sub(v, 1, n - 9)), tonumber(string.sub(v, n - 8))
      end
      local qh = fdiv(hi, l)
      local rest = (hi - qh * l) * E9 + lo
      local ql = fdiv(rest, l)
      tat, frac = qh * E9 + ql, rest - ql * l
    end
  end
  local d = tat - now
  if d >= 0 then
    -- A clock stepped backwards must not leave tat unboundedly ahead.
    if d > ahead then
      d = ahead
    end
    debt = d * l + frac
  end
end

local full = b * w
if ARGV[1] == 'return' then
  debt = math.max(0, debt - cost * w)
else
  local need = debt + cost * w
  if need > full then
    return {0, fdiv(full - debt, w), cdiv(debt, l), cdiv(need - full, l), now}
  end
  debt = need
end

-- Move tat to now + debt/L; the key lives exactly as long as tat.
if debt <= 0 then
  redis.call('DEL', KEYS[1])
else
  local q = fdiv(debt, l)
  local tat, frac, val = now + q, debt - q * l, nil
  if l == 1 then
    val = string.format('%d', tat)
  elseif packed then
    local th = fdiv(tat, E9)
    local low = (tat - th * E9) * l + frac
    local carry = fdiv(low, E9)
    local high = th * l + carry
    low = low - carry * E9
    if high == 0 then
      val = string.format('%d', low)
    else
      val = string.format('%d%09d', high, low)
    end
  else
    val = string.format('%d:%d', tat, frac)
  end
  redis.call('SET', KEYS[1], val, 'PX', cdiv(debt, l * 1000) + pad)
end
return {1, fdiv(full - debt, w), cdiv(debt, l), 0, now}

-- leaky_bucket.lua: the leaky bucket of DESIGN.md section 4 by virtual
-- scheduling, decided exactly as limiter/leaky_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the queue
-- is empty, in µs plus frac < L in units of 1/L µs; in time scaled by L one
-- unit of work costs exactly W. The state is packed as in token_bucket.lua:
-- the one integer tat×L + frac, or "<tat>:<frac>" when L×10^9 >= 2^53.
--
-- ARGV: op ("take" | "return"), cost, now (µs, "" = Redis TIME), ttl pad (ms,
-- 0 outside tests), L, W, max_delay (µs scaled by L), max ahead (µs). L, W and
-- max_delay arrive divided by the greatest common divisor of L and W.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs};
-- on an admission retry_after is how long the request is held.

local cost, pad = tonumber(ARGV[2]), tonumber(ARGV[4])
local l, w, maxdelay, ahead = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

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

-- The queued wait: how far tat lies ahead of now, scaled by L.
local wait = 0
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
    wait = d * l + frac
  end
end

local debt, held = 0, 0
if ARGV[1] == 'return' then
  debt = math.max(0, wait - cost * w)
else
  if wait > maxdelay then
    return {0, 0, cdiv(wait, l), cdiv(wait - maxdelay, l), now}
  end
  debt, held = wait + cost * w, cdiv(wait, l)
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

-- Free queue slots for unit requests.
local remaining = 0
if debt <= maxdelay then
  remaining = fdiv(maxdelay - debt, w) + 1
end
return {1, remaining, cdiv(debt, l), held, now}

-- token_bucket.lua: the token bucket of DESIGN.md section 4, decided exactly
-- as limiter/token_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, the moment the
-- bucket is full again, as "<tat µs>" or "<tat µs>:<frac>" where frac < L is
-- the part of a microsecond in units of 1/L µs. Time scaled by L makes one
-- unit cost exactly W, so every quantity below is an integer.
--
-- ARGV: op ("take" | "return"), cost, now (µs, "" = Redis TIME), ttl pad (ms,
-- 0 outside tests), L, W, B, max ahead (µs). L and W arrive divided by their
-- greatest common divisor, which changes no decision and keeps products small.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs}.

local op, cost, pad = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local l, w, b, ahead = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

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

-- debt = (B - tokens) × W: how far tat lies ahead of now, scaled by L.
local debt = 0
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  local tat, frac
  if sep then
    tat, frac = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  else
    tat, frac = tonumber(v), 0
  end
  local d = tat - now
  if d >= 0 then
    -- A clock stepped backwards must not leave tat unboundedly ahead.
    if d > ahead then
      d = ahead
    end
    debt = d * l + math.min(frac, l - 1)
  end
end

-- Moves tat to now + debt/L and keeps the key exactly as long as tat.
local function save(x)
  if x <= 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local q = fdiv(x, l)
  local frac = x - q * l
  local val
  if frac == 0 then
    val = string.format('%d', now + q)
  else
    val = string.format('%d:%d', now + q, frac)
  end
  redis.call('SET', KEYS[1], val, 'PX', cdiv(x, l * 1000) + pad)
end

local full = b * w
if op == 'return' then
  debt = math.max(0, debt - cost * w)
  save(debt)
  return {1, fdiv(full - debt, w), cdiv(debt, l), 0, now}
end

local need = debt + cost * w
if need > full then
  return {0, fdiv(full - debt, w), cdiv(debt, l), cdiv(need - full, l), now}
end
save(need)
return {1, fdiv(full - need, w), cdiv(need, l), 0, now}

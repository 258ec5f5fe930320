-- leaky_bucket.lua: the leaky bucket of DESIGN.md section 4 by virtual
-- scheduling, decided exactly as limiter/leaky_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the queue
-- is empty, as "<tat µs>" or "<tat µs>:<frac>" with frac < L in units of
-- 1/L µs. In time scaled by L one unit of work costs exactly W.
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

-- The queued wait: how far tat lies ahead of now, scaled by L.
local wait = 0
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
    wait = d * l + math.min(frac, l - 1)
  end
end

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

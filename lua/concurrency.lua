-- concurrency.lua: at most L units of a key in flight (docs/design.md).
--
-- State (KEYS[1], a sorted set): one member per unit in flight, named after
-- the slot that holds it ("<slot>" for its first unit, "<slot>#<i>" for
-- the others) and scored by when the slot lapses, now + W. The instance
-- that holds a slot renews it every W/3 while its request runs (the
-- "renew" operation below), so only an instance that dies, or cannot reach
-- Redis for W, loses its units, after at most W. The key expires when its
-- last slot lapses.
--
-- Sent after prelude.lua, which reads the arguments and the clock.
--
-- ARGV: cost, now, L, W (see prelude.lua; W is how long a slot lives
-- unrenewed), slot id; for a renewal: cost 0, slot id "", "renew", then
-- each slot to renew and its units (id, units, id, units, ...).
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs};
-- reset and retry_after are always 0: a unit frees when a response finishes.

local slot = ARGV[5]
local key = KEYS[1]

redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))

-- The members of units first..last of this slot, at most 1000 of them
-- (unpack is bounded by Lua's C stack).
local function members(first, last)
  local m = {}
  for i = first, last do
    if i == 1 then
      m[#m + 1] = slot
    else
      m[#m + 1] = slot .. '#' .. i
    end
  end
  return m
end

-- Scores units 1..units of the current slot by when they lapse, adding
-- them (renewal false) or, for a renewal, only moving those still there
-- and only later (XX GT): a renewal that waited in a queue behind a newer
-- one must not pull a lapse back.
local function stamp(units, expiry, renewal)
  for first = 1, units, 1000 do
    local add = {}
    for _, m in ipairs(members(first, math.min(units, first + 999))) do
      add[#add + 1] = expiry
      add[#add + 1] = m
    end
    if renewal then
      redis.call('ZADD', key, 'XX', 'GT', unpack(add))
    else
      redis.call('ZADD', key, unpack(add))
    end
  end
end

-- The key lives until its latest lapse, unless no unit is left.
local function expire()
  if redis.call('ZCARD', key) > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', key, ceil((tonumber(last[2]) - now) / 1000) + pad)
  end
end

-- Pushes the lapse of every unit of the named slots to now + W, but
-- adds none back: a slot that lapsed or was released stays gone. Needs
-- Redis 6.2 or later (ZADD GT).
local function renew()
  local expiry = string.format('%d', now + w)
  for i = 7, #ARGV, 2 do
    slot = ARGV[i]
    stamp(tonumber(ARGV[i + 1]), expiry, true)
  end
  expire()
end

if ARGV[6] == 'renew' then
  renew()
  return {1, math.max(0, l - redis.call('ZCARD', key)), 0, 0, now}
end

if op == 'return' then
  if slot ~= '' then
    for first = 1, cost, 1000 do
      redis.call('ZREM', key, unpack(members(first, math.min(cost, first + 999))))
    end
  end
  return {1, math.max(0, l - redis.call('ZCARD', key)), 0, 0, now}
end

local inflight = redis.call('ZCARD', key)
if inflight + cost > l then
  return {0, math.max(0, l - inflight), 0, 0, now}
end
-- The newest slot lapses last, unless a stepped clock left a later one.
stamp(cost, string.format('%d', now + w), false)
expire()
return {1, l - inflight - cost, 0, 0, now}

-- pool_fill.lua: puts units into a region's pool in the regional Redis,
-- as limiter/regional's MemoryPool does (Fill, Unlock, Back, Drain); the
-- state is pool_spend.lua's.
--
-- Sent after prelude.lua: ARGV[1] units (for 'back'; else 0), [2] now,
-- [3] and [4] unused; then [5] mode and:
--   'fill':   [6] token, [7] lifetime µs, [8..15] the batch (u e s m t r
--             z b), [16] 1 if global refused, [17..22] the refusal (dl dm
--             dr dy dz dt), [23] the batch's g. Installs it if the caller
--             holds the lock, and releases it. Reply {1 if installed, the
--             old batch's units, its mark, its g}.
--   'unlock': [6] token. Releases the lock if the caller holds it.
--   'back':   [6] mark, [7] g (0: any). Puts the units back into the
--             batch named mark of global's state g if it has not lapsed
--             and takes units back. Reply {1 if so}.
--   'drain':  [6] mark, [7] 1 to force. Ends the batch named mark once
--             it has lapsed (or at once, forced): takes its units out
--             and lets no give-back into it. Reply {0 gone or empty, 1
--             taken, 2 not lapsed yet; units}.

local key = KEYS[1]
local mode = ARGV[5]

local function num(field)
  local v = redis.call('HGET', key, field)
  if v and not string.find(v, '^%-?%d+$') then
    return nil
  end
  return tonumber(v) or 0
end

local function foreign()
  return redis.error_reply('floodgate: ' .. key .. ' holds a value Floodgate does not write')
end

if mode == 'fill' or mode == 'unlock' then
  if redis.call('HGET', key, 'lk') ~= ARGV[6] then
    return {0, 0, 0, 0}
  end
  if mode == 'unlock' then
    redis.call('HDEL', key, 'lk', 'lu')
    return {1, 0, 0, 0}
  end
  local old, mark, g = num('u'), num('m'), num('g')
  if not old or not mark or not g then
    return foreign()
  end
  redis.call('HSET', key, 'u', ARGV[8], 'e', ARGV[9], 's', ARGV[10], 'm', ARGV[11],
    't', ARGV[12], 'r', ARGV[13], 'z', ARGV[14], 'b', ARGV[15], 'g', ARGV[23])
  redis.call('HDEL', key, 'lk', 'lu', 'dl', 'dm', 'dr', 'dy', 'dz', 'dt')
  local denied = 0
  if ARGV[16] == '1' then
    denied = tonumber(ARGV[17])
    redis.call('HSET', key, 'dl', ARGV[17], 'dm', ARGV[18], 'dr', ARGV[19],
      'dy', ARGV[20], 'dz', ARGV[21], 'dt', ARGV[22])
  end
  local e = tonumber(ARGV[9])
  redis.call('PEXPIRE', key, ceil((math.max(e, denied, now) + 2 * tonumber(ARGV[7]) - now) / 1000) + pad)
  return {1, old, mark, g}
end

local u, e, m, b, g = num('u'), num('e'), num('m'), num('b'), num('g')
if not u or not e or not m or not b or not g then
  return foreign()
end
local mark = tonumber(ARGV[6])

if mode == 'back' then
  local epoch = tonumber(ARGV[7])
  if cost > 0 and m == mark and (epoch == 0 or g == epoch) and now < e and b == 1 then
    redis.call('HSET', key, 'u', u + cost)
    return {1}
  end
  return {0}
end

-- drain: the batch ends, whatever it held, so that no unit comes back
-- into it once its instance stopped tracking it (see Pool.Drain).
if m ~= mark then
  return {0, 0}
end
if ARGV[7] ~= '1' and now < e then
  return {2, 0}
end
redis.call('HSET', key, 'u', 0, 'b', 0, 'e', math.min(e, now))
if u == 0 then
  return {0, 0}
end
return {1, u}

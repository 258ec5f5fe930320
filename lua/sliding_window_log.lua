-- sliding_window_log.lua: the exact sliding window log (docs/design.md),
-- decided as limiter/sliding_window_log.go decides it.
--
-- State (KEYS[1], a list): one element per unit admitted in (now - W,
-- now], the admission time in µs, oldest first, then the state's epoch
-- (prelude.lua) as "e<epoch>". A request of cost c appends c elements
-- before the epoch (which it moves: LREM from the tail finds it at once),
-- so the count is the list's length less one. At the tail, the epoch needs
-- no command beyond those the oldest entries' trimming uses (docs/redis.md
-- lists the ACL user's). A list written before states had epochs has none;
-- the next admission adds it. A list whose entries have all gone is
-- deleted, as Redis deletes an empty list. The key expires W after its
-- newest entry.
--
-- Sent after prelude.lua, which reads the arguments and the clock.
--
-- ARGV: cost, now, L, W (see prelude.lua), a lease's lifetime (µs), the
-- epoch (prelude.lua), and for "return" the time the admission being
-- returned was logged at (µs), for a lease the units wanted.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs},
-- for an admission the units granted and the time they are logged at, and
-- last the state's epoch. A lease (ARGV[7], want >= cost) takes what the window has left, up
-- to want, when it has at least cost. A charge replies as an admission
-- does, its granted the units charged. A lease of more than the cost is
-- logged a lifetime ahead, at the latest time it may be spent, so no
-- window-long span of spend times holds more than L (see
-- limiter/sliding_window_log.go).

local key = KEYS[1]

now = math.max(now, 0)

-- The state's epoch, the last element (base 1), or none (base 0).
local given, epoch, base = ARGV[6], nil, 0
local tail = redis.call('LINDEX', key, -1)
if tail and string.sub(tail, 1, 1) == 'e' then
  epoch = string.match(tail, '^e(%d+)$')
  if not epoch then
    return redis.error_reply('floodgate: ' .. key .. ' holds a value Floodgate does not write')
  end
  base = 1
end

-- Drop the entries that left the window, 64 at a time from the oldest.
local cutoff, drop = now - w, 0
while true do
  local chunk = redis.call('LRANGE', key, drop, drop + 63)
  local k = 0
  for i = 1, #chunk do
    if base == 1 and chunk[i] == tail then
      break
    end
    -- Only what this script writes is state: a time in µs (see
    -- window_state.lua).
    if not string.find(chunk[i], '^%d+$') then
      return redis.error_reply('floodgate: ' .. key .. ' holds a value Floodgate does not write')
    end
    if tonumber(chunk[i]) > cutoff then
      break
    end
    k = i
  end
  drop = drop + k
  if k < 64 then
    break
  end
end
if drop > 0 then
  if drop == redis.call('LLEN', key) - base then
    -- Every entry has gone: so has the state.
    redis.call('DEL', key)
    epoch, base = nil, 0
  else
    redis.call('LTRIM', key, drop, -1)
  end
end

local function newest()
  local last = redis.call('LINDEX', key, -1 - base)
  if last then
    return tonumber(last)
  end
end

-- remaining = L - count; reset = newest + W - now. The state's epoch
-- ends the reply (after, for an admission, what the caller adds).
local function status(allowed, retry, at)
  local count = redis.call('LLEN', key) - base
  local reset = 0
  local last = newest()
  if last then
    reset = math.max(0, last + w - now)
  end
  return {allowed, math.max(0, l - count), reset, retry, at, tonumber(epoch or 0)}
end

local function expire()
  local last = newest()
  if last then
    redis.call('PEXPIRE', key, ceil((last + w - now) / 1000) + pad)
  end
end

if op == 'return' then
  local at = tonumber(ARGV[7])
  -- cost > 0: LREM with a count of 0 removes every match, and a look
  -- (cost 0, naming no admission: time 0) must remove nothing. Only from
  -- the state that logged the units: one a reset began since never did
  -- (given '0' names no state).
  if cost > 0 and at > cutoff and (given == '0' or given == epoch) and redis.call('LREM', key, -cost, string.format('%d', at)) > 0 then
    if redis.call('LLEN', key) == base then
      redis.call('DEL', key)
      epoch, base = nil, 0
    else
      expire()
    end
  end
  return status(1, 0, now)
end

local count = redis.call('LLEN', key) - base
if op == 'charge' then
  -- Logged whether or not the window has room: the log holds more than
  -- L, up to 2L (limiter/sliding_window_log.go); cost becomes the units
  -- charged, and the reply's granted says so.
  cost = math.max(0, math.min(cost, 2 * l - count))
elseif count + cost > l then
  -- When enough of the oldest entries have left for cost units to fit.
  local need = count + cost - l
  local retry = w
  if need <= count then
    retry = tonumber(redis.call('LINDEX', key, need - 1)) + w - now
  end
  return status(0, retry, now)
end

local at, want = now, tonumber(ARGV[7])
if want then
  local granted = math.min(want, l - count)
  if granted > cost then
    at = now + tonumber(ARGV[5])
  end
  cost = granted
end

-- Keep entries in time order even if the clock stepped back.
at = math.max(at, newest() or at)
if cost > 0 then
  if base == 1 then
    redis.call('LREM', key, -1, tail)
  else
    -- A state this call makes (or a log written before states had
    -- epochs) takes the call's epoch.
    epoch = given
  end
  local entry = string.format('%d', at)
  local left = cost
  while left > 0 do
    -- unpack is bounded by Lua's C stack: push at most 1000 at a time,
    -- the epoch after the last.
    local push = {}
    for i = 1, math.min(left, 1000) do
      push[i] = entry
    end
    left = left - #push
    if left == 0 then
      push[#push + 1] = 'e' .. epoch
    end
    redis.call('RPUSH', key, unpack(push))
  end
  base = 1
end
redis.call('PEXPIRE', key, ceil((at + w - now) / 1000) + pad)
local reply = status(1, 0, now)
reply[6], reply[7], reply[8] = cost, at, reply[6]
return reply

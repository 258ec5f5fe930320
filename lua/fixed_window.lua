-- fixed_window.lua: the fixed window (docs/design.md), decided as
-- limiter/fixed_window.go decides it.
--
-- State (KEYS[1], a string): "<window index>:<count>", the units taken in
-- aligned window ⌊now/W⌋. The key expires at the end of its window.
--
-- Sent after prelude.lua, which reads the arguments and the clock, and
-- window.lua.
--
-- ARGV: cost, now, L, W (see prelude.lua), and for "return" the time of
-- the decision being returned (µs), for a lease the units wanted.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs}.
-- A lease (ARGV[5], want >= cost) takes what the window has left, up to
-- want, when it has at least cost, and its reply adds the units granted;
-- so does a charge's, with the units charged.

local win, count, behind = index(now), 0, false
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  if sep then
    local stored = tonumber(string.sub(v, 1, sep - 1))
    if stored and stored >= win then
      -- A clock behind the stored window (Redis's stepped back, or a
      -- failover to a server whose clock is behind) decides at that
      -- window's start, as fixedWindowState.roll does: going back to the
      -- older window would restart its count and readmit a full quota.
      if stored > win then
        win, now, behind = stored, stored * w, true
      end
      count = tonumber(string.sub(v, sep + 1))
    end
  end
end
local left = (win + 1) * w - now

-- An emptied window is deleted, unless the clock is behind it: deleted
-- then, the next decision would count the earlier window afresh, though
-- that window may have been full.
local function save()
  if count <= 0 and not behind then
    redis.call('DEL', KEYS[1])
    return
  end
  redis.call('SET', KEYS[1], string.format('%d:%d', win, count), 'PX', ceil(left / 1000) + pad)
end

if op == 'return' then
  if index(tonumber(ARGV[5])) == win and count > 0 then
    count = math.max(0, count - cost)
    save()
  end
  local reset = 0
  if count > 0 then
    reset = left
  end
  return {1, math.max(0, l - count), reset, 0, now}
end

if op == 'charge' then
  -- Taken whether or not the window has them: the count goes past L, up
  -- to 2L (limiter/fixed_window.go); the reply adds the units charged.
  local was = count
  count = math.max(count, math.min(count + cost, 2 * l))
  save()
  return {1, math.max(0, l - count), left, 0, now, count - was}
end

if count + cost > l then
  return {0, math.max(0, l - count), left, left, now}
end
local want = tonumber(ARGV[5])
if want then
  cost = math.min(want, l - count)
end
count = count + cost
save()
if want then
  return {1, l - count, left, 0, now, cost}
end
return {1, l - count, left, 0, now}

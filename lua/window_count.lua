-- window_count.lua: the count of a fixed window, aligned or calendar,
-- decided as limiter/fixed_window.go decides it. Sent after
-- fixed_window.lua or calendar_window.lua, which read the state (with
-- window_state.lua) and leave:
-- win (the window's name in the state: its index or its start), count,
-- behind (the clock is behind the stored window), left (µs to the
-- window's end), here (a give-back's admission was counted in this
-- window), extra (the index in ARGV of a lease's want), epoch (the
-- state's, from window_state.lua) and given (the call's epoch argument).

-- A window that holds nothing is no state (as limiter's memory store sees
-- it): the next take makes a new one, with a new epoch.
if count == 0 and not behind then
  epoch = nil
end

-- An emptied window is deleted, unless the clock is behind it: deleted
-- then, the next decision would count the earlier window afresh, though
-- that window may have been full.
local function save()
  if count <= 0 and not behind then
    redis.call('DEL', KEYS[1])
    return
  end
  local state = string.format('%d:%d', win, count)
  if epoch then
    state = state .. '@' .. epoch
  end
  redis.call('SET', KEYS[1], state, 'PX', ceil(left / 1000) + pad)
end

if op == 'return' then
  -- Only into the state that counted the units: one a reset began since
  -- never did (given '0' names no state).
  if here and count > 0 and (given == '0' or given == epoch) then
    count = math.max(0, count - cost)
    save()
  end
  local reset = 0
  if count > 0 then
    reset = left
  end
  return {1, math.max(0, l - count), reset, 0, now, tonumber(epoch or 0)}
end

-- A state this call makes (or one written before states had epochs)
-- takes the call's epoch.
epoch = epoch or given

if op == 'charge' then
  -- Taken whether or not the window has them: the count goes past L, up
  -- to 2L (limiter/fixed_window.go); the reply adds the units charged.
  local was = count
  count = math.max(count, math.min(count + cost, 2 * l))
  save()
  return {1, math.max(0, l - count), left, 0, now, count - was, tonumber(epoch)}
end

if count + cost > l then
  return {0, math.max(0, l - count), left, left, now, tonumber(epoch)}
end
local want = tonumber(ARGV[extra])
if want then
  cost = math.min(want, l - count)
end
count = count + cost
save()
if want then
  return {1, l - count, left, 0, now, cost, tonumber(epoch)}
end
return {1, l - count, left, 0, now, tonumber(epoch)}

-- window_state.lua: reads the state fixed_window.lua and
-- calendar_window.lua share, "<window>:<count>": the window's name (its
-- index or its start) and the units taken in it. Sent after prelude.lua
-- (and window.lua) and before either of them, which go on from stored (the
-- stored window's name, nil when the key holds none) and n (its count).

local stored, n
local v = redis.call('GET', KEYS[1])
if v then
  -- Only what window_count.lua writes is state: anything else (nan, inf,
  -- hex, a float, all of which Lua's tonumber takes) fails the decision,
  -- so the zone's fail mode applies, rather than reading as a fresh
  -- window.
  stored, n = string.match(v, '^(%d+):(%d+)$')
  if not stored then
    return redis.error_reply('floodgate: ' .. KEYS[1] .. ' holds a value Floodgate does not write')
  end
  stored = tonumber(stored)
end

-- window_state.lua: reads the state fixed_window.lua and
-- calendar_window.lua share, "<window>:<count>@<epoch>": the window's name
-- (its index or its start), the units taken in it and the state's epoch
-- (see prelude.lua). Sent after prelude.lua (and window.lua) and before
-- either of them, which go on from stored (the stored window's name, nil
-- when the key holds none), n (its count) and epoch (nil for a key that
-- holds none, or a state written before states had epochs: "<window>:<count>").

local stored, n, epoch
local v = redis.call('GET', KEYS[1])
if v then
  -- Only what window_count.lua writes is state: anything else (nan, inf,
  -- hex, a float, all of which Lua's tonumber takes) fails the decision,
  -- so the zone's fail mode applies, rather than reading as a fresh
  -- window.
  stored, n, epoch = string.match(v, '^(%d+):(%d+)@(%d+)$')
  if not stored then
    stored, n = string.match(v, '^(%d+):(%d+)$')
  end
  if not stored then
    return redis.error_reply('floodgate: ' .. KEYS[1] .. ' holds a value Floodgate does not write')
  end
  stored = tonumber(stored)
end

-- leaky_bucket.lua: the leaky bucket (docs/design.md) by virtual
-- scheduling, decided exactly as limiter/leaky_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the queue
-- is empty, in µs plus frac < L in units of 1/L µs; in time scaled by L one
-- unit of work costs exactly W. The state is packed as bucket.lua describes:
-- the one integer tat×L + frac, or "<tat>:<frac>" when L×10^9 >= 2^53.
--
-- Sent after prelude.lua and bucket.lua, which read the arguments, the clock
-- and the state, and before bucket_save.lua, which stores debt and returns
-- reply.
--
-- ARGV: cost, now, L, W (see prelude.lua), max_delay (µs scaled by L), max
-- ahead, the epoch (prelude.lua). L, W and max_delay arrive divided by the
-- greatest common divisor of L and W.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, epoch}, without the decision
-- time as token_bucket.lua explains; on an admission retry_after is how long
-- the request is held.

local maxdelay = tonumber(ARGV[5])
local wait = queued
local debt, held = 0, 0
if op == 'return' then
  debt = wait - cost * w
  if debt < 0 then
    debt = 0
  end
else
  if wait > maxdelay then
    return {0, 0, ceil(wait / l), ceil((wait - maxdelay) / l), tonumber(epoch)}
  end
  debt, held = wait + cost * w, ceil(wait / l)
end

-- Free queue places for unit requests.
local remaining = 0
if debt <= maxdelay then
  remaining = floor((maxdelay - debt) / w) + 1
end
local reply = {1, remaining, ceil(debt / l), held}

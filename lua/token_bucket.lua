-- token_bucket.lua: the token bucket (docs/design.md), decided exactly
-- as limiter/token_bucket.go decides it. Sent after prelude.lua and
-- bucket.lua, which read the arguments, the clock and the state, and before
-- bucket_save.lua, which stores debt and returns reply.
--
-- ARGV: cost, now, L, W (see prelude.lua), B, max ahead. L and W arrive
-- divided by their greatest common divisor, which changes no decision and
-- keeps products small.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs}. Unlike the window
-- algorithms' it leaves out the decision time: a bucket's reset is a
-- duration with no boundary to align to, and the reply stays shorter.

local b = tonumber(ARGV[5])
local debt, full = queued, b * w
if op == 'return' then
  debt = debt - cost * w
  if debt < 0 then
    debt = 0
  end
else
  local need = debt + cost * w
  if need > full then
    return {0, floor((full - debt) / w), ceil(debt / l), ceil((need - full) / l)}
  end
  debt = need
end
local reply = {1, floor((full - debt) / w), ceil(debt / l), 0}

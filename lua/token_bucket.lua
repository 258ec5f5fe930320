-- token_bucket.lua: the token bucket (docs/design.md), decided exactly
-- as limiter/token_bucket.go decides it. Sent after prelude.lua and
-- bucket.lua, which read the arguments, the clock and the state, and before
-- bucket_save.lua, which stores debt and returns reply.
--
-- ARGV: cost, now, L, W (see prelude.lua), B, max ahead, the epoch
-- (prelude.lua), and for a lease the units wanted (see below). L and W arrive divided by their greatest
-- common divisor, which changes no decision and keeps products small.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, epoch}. Unlike the window
-- algorithms' it leaves out the decision time: a bucket's reset is a
-- duration with no boundary to align to, and the reply stays shorter.
--
-- A lease (ARGV[8], want >= cost) takes as many tokens as the bucket
-- holds, up to want, when it holds at least cost; it is refused exactly
-- as a take of cost is. Its reply adds the decision time and the units
-- granted: {1, remaining, reset µs, 0, now µs, granted, epoch}. A charge
-- replies in the same shape, with the tokens it charged.

local b = tonumber(ARGV[5])
local debt, full = queued, b * w
if op == 'return' then
  debt = debt - cost * w
  if debt < 0 then
    debt = 0
  end
elseif op == 'charge' then
  -- Taken whether or not the bucket holds them: tokens fall to -B at
  -- most (debt <= 2 x B x W), the rest is forgiven; cost becomes the
  -- tokens charged (limiter/token_bucket.go). A debt a clock stepped
  -- back put beyond the cap stays.
  local was = debt
  debt = math.max(debt, math.min(debt + cost * w, 2 * full))
  cost = math.max(0, ceil((debt - was) / w))
else
  local need = debt + cost * w
  if need > full then
    -- Never negative: a clock behind the state reads a debt beyond the
    -- burst (limiter/token_bucket.go).
    return {0, math.max(0, floor((full - debt) / w)), ceil(debt / l), ceil((need - full) / l), tonumber(epoch)}
  end
  local want = tonumber(ARGV[8])
  if want then
    cost = math.min(want, floor((full - debt) / w))
    need = debt + cost * w
  end
  debt = need
end
local reply = {1, math.max(0, floor((full - debt) / w)), ceil(debt / l), 0}
if (ARGV[8] and op == 'take') or op == 'charge' then
  reply[5], reply[6] = now, cost
end

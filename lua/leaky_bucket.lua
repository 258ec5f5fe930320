-- leaky_bucket.lua: the leaky bucket of DESIGN.md section 4 by virtual
-- scheduling, decided exactly as limiter/leaky_bucket.go decides it.
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the queue
-- is empty, in µs plus frac < L in units of 1/L µs; in time scaled by L one
-- unit of work costs exactly W. The state is packed as bucket.lua describes:
-- the one integer tat×L + frac, or "<tat>:<frac>" when L×10^9 >= 2^53.
--
-- Sent after prelude.lua and bucket.lua, which read the arguments, the clock
-- and the state.
--
-- ARGV: op, cost, now, ttl pad, L, W (see prelude.lua), max_delay (µs scaled
-- by L), max ahead. L, W and max_delay arrive divided by the greatest common
-- divisor of L and W.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs};
-- on an admission retry_after is how long the request is held.

local maxdelay = tonumber(ARGV[7])
local wait = queued
local debt, held = 0, 0
if op == 'return' then
  debt = math.max(0, wait - cost * w)
else
  if wait > maxdelay then
    return {0, 0, cdiv(wait, l), cdiv(wait - maxdelay, l), now}
  end
  debt, held = wait + cost * w, cdiv(wait, l)
end
save(debt)

-- Free queue slots for unit requests.
local remaining = 0
if debt <= maxdelay then
  remaining = fdiv(maxdelay - debt, w) + 1
end
return {1, remaining, cdiv(debt, l), held, now}

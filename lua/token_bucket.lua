-- token_bucket.lua: the token bucket of DESIGN.md section 4, decided exactly
-- as limiter/token_bucket.go decides it. Sent after prelude.lua and
-- bucket.lua, which read the arguments, the clock and the state.
--
-- ARGV: op, cost, now, ttl pad, L, W (see prelude.lua), B, max ahead. L and
-- W arrive divided by their greatest common divisor, which changes no
-- decision and keeps products small.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs}.

local b = tonumber(ARGV[7])
local debt = queued
local full = b * w
if op == 'return' then
  debt = math.max(0, debt - cost * w)
else
  local need = debt + cost * w
  if need > full then
    return {0, fdiv(full - debt, w), cdiv(debt, l), cdiv(need - full, l), now}
  end
  debt = need
end
save(debt)
return {1, fdiv(full - debt, w), cdiv(debt, l), 0, now}

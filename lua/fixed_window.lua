-- fixed_window.lua: the fixed window (docs/design.md), decided as
-- limiter/fixed_window.go decides it.
--
-- State (KEYS[1], a string): "<window index>:<count>", the units taken in
-- aligned window ⌊now/W⌋. The key expires at the end of its window.
--
-- Sent after prelude.lua, which reads the arguments and the clock,
-- window.lua and window_state.lua, which reads the state; followed by
-- window_count.lua, which decides.
--
-- ARGV: cost, now, L, W (see prelude.lua), the epoch (prelude.lua), and
-- for "return" the time of the decision being returned (µs), for a lease
-- the units wanted.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs,
-- epoch}. A lease (ARGV[6], want >= cost) takes what the window has left,
-- up to want, when it has at least cost, and its reply adds the units
-- granted before the epoch; so does a charge's, with the units charged.

local win, count, behind = index(now), 0, false
if stored and stored >= win then
  -- A clock behind the stored window (Redis's stepped back, or a
  -- failover to a server whose clock is behind) decides at that
  -- window's start, as fixedWindowState.roll does: going back to the
  -- older window would restart its count and readmit a full quota.
  if stored > win then
    win, now, behind = stored, stored * w, true
  end
  count = tonumber(n)
end
local left = (win + 1) * w - now
-- A give-back names its admission's time (ARGV[6]), which counts here only
-- if it fell in this window; a lease's want is ARGV[6] too.
local given, here, extra = ARGV[5], false, 6
if op == 'return' then
  here = index(tonumber(ARGV[6])) == win
end

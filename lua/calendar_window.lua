-- calendar_window.lua: the fixed window over calendar windows (a time
-- zone's days, weeks or months; docs/design.md), decided as
-- limiter/fixed_window.go decides it for a policy with a Calendar. It is
-- fixed_window.lua with the window named by its start instead of ⌊now/W⌋.
--
-- Redis's TIME stays the clock. Where windows begin needs the time zone
-- database, which Redis lacks, so the instance computes it: it sends the
-- starts of four consecutive windows around its own clock, s1 < s2 < s3 <
-- s4, and the script decides in whichever of [s1, s2), [s2, s3), [s3, s4)
-- holds now. Instances whose clocks differ from Redis's by less than a
-- window therefore still agree. A now outside all three (a clock a whole
-- window off) is refused with an error, so the zone's fail mode applies
-- rather than a window nobody named.
--
-- State (KEYS[1], a string): "<window start µs>:<count>", the units taken
-- in the window that begins there. The key expires at the window's end.
--
-- Sent after prelude.lua, which reads the arguments and the clock (it reads
-- s1 as W, which this script does not use), and window_state.lua, which
-- reads the state; followed by window_count.lua, which decides.
--
-- ARGV: cost, now, L (see prelude.lua), s1, s2, s3, s4, the epoch
-- (prelude.lua), and for "return" the time of the decision being returned
-- (µs), for a lease the units wanted.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs,
-- epoch}. A lease (ARGV[9], want >= cost) takes what the window has left,
-- up to want, when it has at least cost, and its reply adds the units
-- granted before the epoch; so does a charge's, with the units charged.

local s1, s2, s3, s4 = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local win, ends
if now >= s2 and now < s3 then
  win, ends = s2, s3
elseif now >= s1 and now < s2 then
  win, ends = s1, s2
elseif now >= s3 and now < s4 then
  win, ends = s3, s4
else
  return redis.error_reply('calendar window: the server time is not within the windows the instance sent; is its clock a whole window off?')
end

local count, behind = 0, false
if stored and stored >= win then
  -- A clock behind the stored window decides at that window's start,
  -- as fixedWindowState.roll does (see fixed_window.lua).
  if stored > win then
    if stored == s2 then
      ends = s3
    elseif stored == s3 then
      ends = s4
    else
      return redis.error_reply('calendar window: the server time is behind the stored window by more than the instance sent')
    end
    win, now, behind = stored, stored, true
  end
  count = tonumber(n)
end
local left = ends - now
-- A give-back names its admission's time (ARGV[9]), which counts here only
-- if it fell in this window; a lease's want is ARGV[9] too.
local given, here, extra = ARGV[8], false, 9
if op == 'return' then
  local at = tonumber(ARGV[9])
  here = at >= win and at < ends
end

-- bucket.lua: reads the state token_bucket.lua and leaky_bucket.lua share;
-- sent after prelude.lua and before either of them, which decide, set debt
-- and reply, and are followed by bucket_save.lua (see lua/scripts.go).
--
-- State (KEYS[1], a string): the theoretical arrival time tat, when the
-- bucket is full again (token) or its queue empty (leaky), in µs plus
-- frac < L in units of 1/L µs. Time scaled by L makes one unit cost exactly
-- W, so every quantity below is an integer.
-- tat and frac are packed into the one integer tat×L + frac, which Redis
-- keeps in the 8 bytes of an integer-encoded string (while below 2^63, i.e.
-- for L up to a few thousand), so a key costs no more than a plain counter.
-- Doubles cannot hold that integer exactly, so it is split into 9-digit
-- halves: exact while L×10^9 < 2^53; beyond that the state is written as
-- "<tat>:<frac>". The key's name carries the reduced L (bucketKeyQualifier in
-- limiter/algorithm.go), so a value
-- is never read with another L than it was written with.
--
-- After it comes the state's epoch (see prelude.lua), "@<epoch>"; a state
-- written before states had epochs has none.
--
-- ARGV[6]: max ahead (µs), the furthest tat may lie ahead of now; ARGV[7]:
-- the epoch (prelude.lua).

local ahead, given, epoch = tonumber(ARGV[6]), ARGV[7], nil

local E9 = 1000000000

-- queued: how far tat lies ahead of now, scaled by L. For a token bucket it
-- is (B - tokens)×W, for a leaky bucket the wait a request would queue for.
local queued = 0
local v = redis.call('GET', KEYS[1])
if v then
  local body, e = string.match(v, '^([%d:]+)@(%d+)$')
  if body then
    v, epoch = body, e
  end
  -- Only what bucket_save.lua writes is state: digits, or digits:digits
  -- (see window_state.lua).
  if not string.find(v, '^%d+$') and not string.find(v, '^%d+:%d+$') then
    return redis.error_reply('floodgate: ' .. KEYS[1] .. ' holds a value Floodgate does not write')
  end
  local tat, frac = tonumber(v), 0
  if l ~= 1 then
    local sep = string.find(v, ':', 1, true)
    if sep then
      tat, frac = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
    else
      -- hi×10^9 + lo = (qh×10^9 + ql)×L + frac, by long division.
      local n, hi, lo = #v, 0, tat
      if n > 9 then
        hi, lo = tonumber(string.sub(v, 1, n - 9)), tonumber(string.sub(v, n - 8))
      end
      local qh = floor(hi / l)
      local rest = (hi - qh * l) * E9 + lo
      local ql = floor(rest / l)
      tat, frac = qh * E9 + ql, rest - ql * l
    end
  end
  local d = tat - now
  if d >= 0 then
    -- A clock stepped backwards must not leave tat unboundedly ahead.
    if d > ahead then
      d = ahead
    end
    queued = d * l + frac
  end
end
-- A bucket that holds nothing is no state (as limiter's memory store
-- sees it): the next take makes a new one, with a new epoch.
if queued == 0 then
  epoch = nil
end
if op == 'return' then
  -- Only into the state that counted the units: one a reset began since
  -- never did (given '0' names no state). Given back to another, they are
  -- dropped, and the call reports the state as a look would.
  if given ~= '0' and given ~= epoch then
    cost = 0
  end
else
  -- A state this call makes (or one written before states had epochs)
  -- takes the call's epoch.
  epoch = epoch or given
end

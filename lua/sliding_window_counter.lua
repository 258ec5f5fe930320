-- sliding_window_counter.lua: the sliding window counter (docs/design.md),
-- decided exactly as limiter/sliding_window_counter.go decides it:
-- est + c <= L is tested as prev×(W - e) + (cur + c)×W <= L×W.
--
-- State (KEYS[1], a string): "<window index>:<prev>:<cur>@<epoch>", the
-- counts of window ⌊now/W⌋ and of the one before it, and the state's
-- epoch (prelude.lua; a state written before states had epochs has none).
-- The key expires at the end of the next window while cur holds units,
-- else at the end of this one.
--
-- Sent after prelude.lua, which reads the arguments and the clock, and
-- window.lua.
--
-- ARGV: cost, now, L, W (see prelude.lua), the epoch (prelude.lua), and
-- for "return" the time of the decision being returned (µs), for a lease
-- the units wanted.
--
-- Reply: {allowed, remaining, reset µs, retry_after µs, decision time µs,
-- epoch}. A lease (ARGV[6], want >= cost) takes the most units that fit,
-- up to want, when cost fits, and its reply adds the units granted before
-- the epoch; so does a charge's, with the units charged.

-- Roll the stored counts forward to the window now falls in.
local win, prev, cur, behind = index(now), 0, 0, false
local given, epoch = ARGV[5], nil
local v = redis.call('GET', KEYS[1])
if v then
  local a, p, c
  a, p, c, epoch = string.match(v, '^(%d+):(%d+):(%d+)@(%d+)$')
  if not a then
    a, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
  end
  if not a then
    -- Only what this script writes is state (see window_state.lua).
    return redis.error_reply('floodgate: ' .. KEYS[1] .. ' holds a value Floodgate does not write')
  end
  a = tonumber(a)
  if a >= win then
    -- A clock behind the stored window decides at that window's start,
    -- as slidingCounterState.roll does, rather than drop both counts.
    if a > win then
      win, now, behind = a, a * w, true
    end
    prev, cur = tonumber(p), tonumber(c)
  elseif a + 1 == win then
    prev = tonumber(c)
  end
end
local e = now - win * w
-- Counts that hold nothing are no state (as limiter's memory store sees
-- it): the next take makes a new one, with a new epoch.
if prev == 0 and cur == 0 and not behind then
  epoch = nil
end

local function status(allowed, retry)
  local est = prev * (w - e) + cur * w
  local reset = 0
  if cur > 0 then
    reset = (win + 2) * w - now
  elseif prev > 0 then
    reset = (win + 1) * w - now
  end
  return {allowed, math.max(0, floor((l * w - est) / w)), reset, retry, now}
end

-- done adds the state's epoch to a reply.
local function done(reply)
  reply[#reply + 1] = tonumber(epoch or 0)
  return reply
end

local function save()
  local left
  if cur > 0 then
    left = (win + 2) * w - now
  elseif prev > 0 or behind then
    -- Emptied while the clock is behind the stored window, it is kept:
    -- deleted, the earlier window would be counted afresh.
    left = (win + 1) * w - now
  else
    redis.call('DEL', KEYS[1])
    return
  end
  local state = string.format('%d:%d:%d', win, prev, cur)
  if epoch then
    state = state .. '@' .. epoch
  end
  redis.call('SET', KEYS[1], state, 'PX', ceil(left / 1000) + pad)
end

if op == 'return' then
  -- Only into the state that counted the units: one a reset began since
  -- never did (given '0' names no state).
  local taken = index(tonumber(ARGV[6]))
  if given ~= '0' and given ~= epoch then
    taken = nil
  end
  if taken == win and cur > 0 then
    cur = math.max(0, cur - cost)
    save()
  elseif taken == win - 1 and prev > 0 then
    prev = math.max(0, prev - cost)
    save()
  end
  return done(status(1, 0))
end

-- A state this call makes (or one written before states had epochs)
-- takes the call's epoch.
epoch = epoch or given

if op == 'charge' then
  -- Taken whether or not they fit: cur goes past L, up to 2L
  -- (limiter/sliding_window_counter.go), so prev and cur stay within 2L
  -- and est within 4 x L x W, which limiter/redis.go keeps exact.
  local was = cur
  cur = math.max(cur, math.min(cur + cost, 2 * l))
  save()
  local reply = status(1, 0)
  reply[6] = cur - was
  return done(reply)
end

-- cur + cost > L first: after a charge, cur and prev reach 2L, and the
-- product (cur + cost) x W alone could leave the exact range; past L the
-- request is refused whatever prev holds.
if cur + cost > l or prev * (w - e) + (cur + cost) * w > l * w then
  -- The least x with est(now + x) + c <= L, nothing else arriving.
  local rest = w - e
  local retry
  local slack = l - cur - cost
  if slack >= 0 and prev > 0 then
    -- Later in this window, as prev's weight decays. x > 0: the request
    -- was refused, so prev×rest > slack×W.
    local x = ceil((prev * rest - slack * w) / prev)
    if x < rest then
      retry = x
    end
  end
  if not retry then
    if cur == 0 then
      retry = rest
    else
      -- In the next window, at e' into it: cur×(W - e') <= (L - c)×W.
      local ep = math.max(0, ceil((cur - l + cost) * w / cur))
      if ep < w then
        retry = rest + ep
      else
        retry = rest + w
      end
    end
  end
  return done(status(0, retry))
end
local want = tonumber(ARGV[6])
if want then
  -- The most g with prev×(W - e) + (cur + g)×W <= L×W.
  cost = math.min(want, floor((l * w - prev * (w - e)) / w) - cur)
end
cur = cur + cost
save()
local reply = status(1, 0)
if want then
  reply[6] = cost
end
return done(reply)

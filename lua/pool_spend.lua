-- pool_spend.lua: spends a region's units from its pool in the regional
-- Redis, as limiter/regional's MemoryPool.Spend does (the reference; see
-- limiter/regional/pool.go for what each field means).
--
-- State (KEYS[1], a hash): the batch (u units, e expires µs, s sent µs,
-- m mark, t r z global's decision time, remaining and reset, b 1 when
-- give-backs may go into it, g the epoch of global's state that granted
-- it, see lua/prelude.lua), global's refusal repeated (dl until, dm
-- made, dr remaining, dy retry, dz reset, dt time), the refill lock (lk
-- token, lu until) and sz, the next batch's size.
--
-- Sent after prelude.lua: ARGV[1] cost, [2] now, [3] and [4] unused; then
-- [5] mode ('take', 'pay' or 'peek'), [6] want, [7] token, [8] lock µs,
-- [9] the largest batch, [10] a batch's lifetime µs.
--
-- Reply: {outcome, units, now, u, e, s, m, t, r, z, b, want, wait, dl,
-- dm, dr, dy, dz, dt, g}; outcome 0 none, 1 taken, 2 denied, 3 wait (another
-- instance refills), 4 refill (the caller now holds the lock; units are a
-- lapsed batch's rest, moved out for the refill to return).

local key = KEYS[1]
local mode = ARGV[5]
local names = {'u', 'e', 's', 'm', 't', 'r', 'z', 'b', 'dl', 'dm', 'dr', 'dy', 'dz', 'dt', 'lu', 'sz', 'g'}
local raw = redis.call('HMGET', key, unpack(names))
local f = {}
for i = 1, #names do
  local v = raw[i]
  if v and not string.find(v, '^%-?%d+$') then
    return redis.error_reply('floodgate: ' .. key .. ' holds a value Floodgate does not write')
  end
  f[names[i]] = tonumber(v) or 0
end
local lk = redis.call('HGET', key, 'lk')

local function reply(outcome, units, want, wait)
  return {outcome, units, now, f.u, f.e, f.s, f.m, f.t, f.r, f.z, f.b, want, wait,
    f.dl, f.dm, f.dr, f.dy, f.dz, f.dt, f.g}
end

if mode == 'peek' then
  return reply(0, 0, 0, 0)
end

if mode == 'pay' then
  local paid = 0
  if now < f.e then
    paid = math.min(f.u, cost)
    if paid > 0 then
      f.u = f.u - paid
      redis.call('HSET', key, 'u', f.u)
      return reply(1, paid, 0, 0)
    end
  end
  return reply(0, 0, 0, 0)
end

local want = tonumber(ARGV[6])
if now < f.dl then
  return reply(2, 0, 0, 0)
end
if now < f.e and f.u >= cost then
  local g = math.min(want, f.u)
  f.u = f.u - g
  redis.call('HSET', key, 'u', f.u)
  return reply(1, g, 0, 0)
end
if lk and now < f.lu then
  return reply(3, 0, 0, f.lu - now)
end

-- The refill is the caller's. A lapsed batch's units go back to global
-- with it; a short one's stay for smaller requests until the next batch
-- replaces it.
local back = 0
if now >= f.e then
  back, f.u = f.u, 0
end
local maxb, life = tonumber(ARGV[9]), tonumber(ARGV[10])
if f.s == 0 or now - f.s >= 2 * life then
  f.sz = want
elseif now < f.e then
  f.sz = math.min(2 * f.sz, maxb)
end
local ask = math.max(cost, math.min(math.max(f.sz, want), maxb))
f.lu = now + tonumber(ARGV[8])
redis.call('HSET', key, 'u', f.u, 'sz', f.sz, 'lk', ARGV[7], 'lu', f.lu)
redis.call('PEXPIRE', key, ceil((math.max(f.e, f.lu, f.dl) + 2 * life - now) / 1000) + pad)
return reply(4, back, ask, 0)

-- override_set.lua: writes or deletes one key's runtime override in its
-- zone's set and tells every instance, in one atomic call, so the set's
-- version, its TTL and the message that announces the change can never
-- disagree with the write (limiter/redis_overrides.go). It stands alone,
-- without prelude.lua: it reads no clock.
--
-- KEYS[1]  the zone's set, a hash: field "" holds the set's version (a
--          token every write changes), every other field is an override's
--          key and holds its JSON record.
-- ARGV[1]  the override's key (a field, never "")
-- ARGV[2]  its record, or "" to delete the field
-- ARGV[3]  the set's new version, or "" to write without changing the
--          version or publishing: the pruning of a lapsed record, which no
--          instance applies anyway
-- ARGV[4]  for a record: how many ms from now the set must live for it
--          (its expiry plus a margin for clock skew), or 0 when it never
--          lapses. Relative, so no clock is compared with Redis's.
-- ARGV[5]  the channel to publish the change on
-- ARGV[6]  the zone's name, carried in the message
-- ARGV[7]  the most fields a new key may join (0: no bound)
-- ARGV[8]  the mark that starts the field of every prefix override
--          (limiter.PrefixOverrideName), which is also the field that
--          counts them (the name of an empty prefix, which none has)
-- ARGV[9]  the most prefix overrides a new one may join (0: no bound)
-- ARGV[10] optional: write or delete only while the field holds exactly
--          this ("" for a write: while it holds nothing), so a pruning
--          never removes a record written again meanwhile, and a writer
--          that chose the record by what the field held (its Gen) never
--          overwrites a record written since it read
--
-- Reply: {existed, previous version}: existed is 1 when the field held a
-- record, 0 when it did not (nothing is written for a delete then), -1
-- when a new key was refused because the set is full, -2 when a write's
-- ARGV[10] no longer held (nothing is written), -3 when a new prefix was
-- refused because the set holds ARGV[9] prefixes; the previous version is
-- "" for a set that had none.
--
-- The count of prefix overrides is kept by this script alone, as they
-- are written and deleted (prunings included), so bounding them never
-- scans the set. A field removed by other means leaves it high: the bound
-- then refuses early, never late.
--
-- The message is "<previous>\n<new>\n<zone>\n<key>", the key last since it
-- may hold anything. An instance whose last known version is <previous>
-- applies just that key; any other reloads the whole set.
--
-- The set lives at least as long as its longest-lived record: a record
-- without expiry makes it persistent, one with an expiry extends its TTL
-- when the set is new or would lapse sooner, and a persistent set stays
-- so. Redis thus drops a set once every record in it has lapsed.

local set = KEYS[1]
local field, record, version = ARGV[1], ARGV[2], ARGV[3]
local mark, expect = ARGV[8], ARGV[10]
local prev = redis.call('HGET', set, '')
if not prev then
  prev = ''
end
local old = redis.call('HGET', set, field)
local existed = 0
if old then
  existed = 1
end
local prefixes, isPrefix = 0, false
if mark ~= '' then
  prefixes = tonumber(redis.call('HGET', set, mark) or '0') or 0
  isPrefix = #field > #mark and string.sub(field, 1, #mark) == mark
end

if record == '' then
  if not old or (expect and old ~= expect) then
    return {0, prev}
  end
  redis.call('HDEL', set, field)
  if isPrefix then
    if prefixes > 1 then
      redis.call('HSET', set, mark, prefixes - 1)
    else
      redis.call('HDEL', set, mark)
    end
  end
else
  if expect and ((expect == '' and old) or (expect ~= '' and old ~= expect)) then
    return {-2, prev}
  end
  if not old then
    local most, mostPrefixes = tonumber(ARGV[7]), tonumber(ARGV[9])
    -- Fields less the version's and the count's.
    local held = redis.call('HLEN', set) - 1
    if prefixes > 0 then
      held = held - 1
    end
    if most > 0 and held >= most then
      return {-1, prev}
    end
    if isPrefix and mostPrefixes > 0 and prefixes >= mostPrefixes then
      return {-3, prev}
    end
  end
  local ttl = redis.call('PTTL', set)
  redis.call('HSET', set, field, record)
  if isPrefix and not old then
    redis.call('HSET', set, mark, prefixes + 1)
  end
  local keep = tonumber(ARGV[4])
  if keep == 0 then
    redis.call('PERSIST', set)
  elseif ttl == -2 or (ttl >= 0 and ttl < keep) then
    redis.call('PEXPIRE', set, keep)
  end
end

if version ~= '' then
  redis.call('HSET', set, '', version)
  redis.call('PUBLISH', ARGV[5], prev .. '\n' .. version .. '\n' .. ARGV[6] .. '\n' .. field)
end
return {existed, prev}

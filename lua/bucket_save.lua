-- bucket_save.lua: the end of token_bucket.lua's and leaky_bucket.lua's
-- scripts on every path that changes the state. It moves tat to
-- now + debt/L, packed as bucket.lua describes, with the state's epoch,
-- and returns the reply the algorithm built, the epoch added; the key
-- lives exactly as long as tat lies ahead.
-- Written inline rather than as a function the algorithms call, because the
-- interpreter would create that function anew on every call.

if debt <= 0 then
  redis.call('DEL', KEYS[1])
else
  local val
  if l == 1 then
    -- Redis writes a whole number below 2^53 without an exponent.
    val = now + debt
  else
    local q = floor(debt / l)
    local tat, frac = now + q, debt - q * l
    if l * E9 < 9007199254740992 then
      local th = floor(tat / E9)
      local low = (tat - th * E9) * l + frac
      local carry = floor(low / E9)
      local high = th * l + carry
      low = low - carry * E9
      if high == 0 then
        val = low
      else
        val = string.format('%d%09d', high, low)
      end
    else
      val = string.format('%d:%d', tat, frac)
    end
  end
  if epoch then
    -- A number is written whole, as SET writes it, not as Lua's
    -- concatenation would (with an exponent, past 14 digits).
    if type(val) == 'number' then
      val = string.format('%d', val)
    end
    val = val .. '@' .. epoch
  end
  redis.call('SET', KEYS[1], val, 'PX', ceil(debt / (l * 1000)) + pad)
end
reply[#reply + 1] = tonumber(epoch or 0)
return reply

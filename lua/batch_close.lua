-- batch_close.lua: the end of decide (see batch_open.lua) and the loop
-- that runs the operations in order.
end

-- KEYS[i] is operation i's key. ARGV holds, for each operation in turn,
-- how many arguments it has and then those arguments, as a lone script of
-- the algorithm takes them. The reply holds every operation's reply, in
-- order: its array, or its error (an operation that refuses a key's state
-- fails alone, and the operations after it still run). A WRONGTYPE
-- error inside an operation (the key holds a hash, say) is caught with
-- pcall and becomes that operation's error too, so it does not end
-- the script after the operations before it were applied and leave their
-- units taken with no reply. Every algorithm reads its key before it
-- writes, so an operation that raises has written nothing.
local at, replies = 1, {}
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  local args = {}
  for j = 1, n do
    args[j] = ARGV[at + j]
  end
  at = at + n + 1
  local ok, reply = pcall(decide, {KEYS[i]}, args)
  if ok then
    replies[i] = reply
  else
    -- Redis hands pcall a command's error as a table with err, or as a
    -- string, depending on the server's version.
    local msg = type(reply) == 'table' and tostring(reply.err) or tostring(reply)
    if not string.find(msg, 'WRONGTYPE', 1, true) then
      -- Any other error (a command the server's ACL refuses, as TIME)
      -- ends the script as before: the store reads it from the call's
      -- error.
      error(reply)
    end
    replies[i] = redis.error_reply(msg)
  end
end
return replies

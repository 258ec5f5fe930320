-- batch_close.lua: the end of decide (see batch_open.lua) and the loop
-- that runs the operations in order.
end

-- KEYS[i] is operation i's key. ARGV holds, for each operation in turn,
-- how many arguments it has and then those arguments, as a lone script of
-- the algorithm takes them. The reply holds every operation's reply, in
-- order: its array, or its error (an operation that refuses a key's state
-- fails alone, and the operations after it still run).
local at, replies = 1, {}
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  local args = {}
  for j = 1, n do
    args[j] = ARGV[at + j]
  end
  at = at + n + 1
  replies[i] = decide({KEYS[i]}, args)
end
return replies

-- batch_close.lua: the end of decide (see batch_open.lua) and the loop
-- that runs the operations in order.
end

-- KEYS[i] is operation i's key. ARGV holds, for each operation in turn,
-- how many arguments it has and then those arguments, as a lone script of
-- the algorithm takes them. The reply is the last operation's.
local at, reply = 1, nil
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  local args = {}
  for j = 1, n do
    args[j] = ARGV[at + j]
  end
  at = at + n + 1
  reply = decide({KEYS[i]}, args)
end
return reply

-- batch_open.lua: the start of a batch script, which runs several
-- operations, each a whole algorithm script, in one atomic EVALSHA.
-- lua.Batch sends it first, then prelude.lua and the algorithm's files, then
-- batch_close.lua, so an algorithm's script becomes the body of decide: its
-- KEYS and ARGV are the parameters of one operation, its return statements
-- return from decide, and every file reads as it does alone.
--
-- A near cache uses batches to give back many leases in one call, to give
-- back a lapsed lease's units in the call that takes the next one, and to
-- take the leases of several keys that its requests asked for while
-- another call was under way (limiter/redisstore/batch_script.go,
-- lease_batch.go).

local function decide(KEYS, ARGV)

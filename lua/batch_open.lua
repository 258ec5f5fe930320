-- batch_open.lua: the start of a batch script, which runs several
-- operations, each a whole algorithm script, in one atomic EVALSHA.
-- lua.Batch sends it first, then prelude.lua and the algorithm's files, then
-- batch_close.lua, so an algorithm's script becomes the body of decide: its
-- KEYS and ARGV are the parameters of one operation, its return statements
-- return from decide, and every file reads as it does alone.
--
-- A NearCache uses batches to give back many leases in one call and to give
-- back a lapsed lease's units in the call that takes the next one
-- (limiter/redis_batch_script.go).

local function decide(KEYS, ARGV)

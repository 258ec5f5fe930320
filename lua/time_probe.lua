-- time_probe.lua: whether this server lets scripts call TIME. Some do not
-- (AWS ElastiCache Serverless; a server with TIME renamed away), and every
-- other script here reads its clock from TIME (prelude.lua), so on those
-- servers the Redis store sends the instance's clock instead (see
-- limiter/redis_clock.go). Run with EVAL when the store's scripts load and
-- again when a decision fails in a way a refused TIME would explain.
--
-- Reply: 1 when TIME works inside scripts, 0 when the server refuses it.
-- It names no key, so it runs on any node; it writes nothing.

local t = redis.pcall('TIME')
if type(t) == 'table' and t.err then
  return 0
end
return 1

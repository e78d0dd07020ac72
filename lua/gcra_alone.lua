-- gcra_alone: what reserve_gcra.lua reads and writes through when it runs
-- alone (a batch, reserve_batch.lua, defines its own): TIME every call,
-- one MGET, one SET ... GET under pcall.
local batch_time = nil
local function read_keys(k, p, l, c) return redis.call('MGET', k, p, l, c) end
local function write_tat(k, v, ttl) return redis.pcall('SET', k, v, 'PX', ttl, 'GET') end

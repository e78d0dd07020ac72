-- permit_take: take one lease of an in-flight key if fewer than limit are
-- held. The key is a sorted set: lease ids scored by their expiry (ms on the
-- script's clock). A lease whose expiry has come (score <= now) is dropped
-- first, never one before. An id already held is refreshed and taken again
-- (a retried call). The key lives as long as its latest lease.
-- KEYS[1]: the in-flight key. ARGV[1]: now in ms ('' for TIME); ARGV[2]: the
--   limit; ARGV[3]: the lease in ms; ARGV[4]: the lease's id.
-- Reply: {'1' taken or '0' refused, the leases held after the call, the ms
--   until the earliest held lease expires ('inf': none is held)}.
local key, now = KEYS[1], clock(ARGV[1])
local limit, lease, id = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES') -- check before writing anything
if last.err then return refuse(1, 'in-flight key holds a value of another type') end
if last[2] and tonumber(last[2]) == math.huge then return refuse(1, 'in-flight key holds a lease that never expires') end
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
local ok = '0'
if redis.call('ZSCORE', key, id) or redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, fmt(now + lease), id)
  ok = '1'
  last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local ttl = math.ceil(tonumber(last[2]) - now)
  if ttl < 1 then ttl = 1 end
  redis.call('PEXPIRE', key, ttl)
end
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
local expiry = 'inf'
if first[2] then expiry = fmt(tonumber(first[2]) - now) end
return {ok, fmt(redis.call('ZCARD', key)), expiry}

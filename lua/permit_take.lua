-- permit_take: take one lease of an in-flight key if fewer than limit are
-- held. The key is a sorted set: lease ids scored by their expiry (ms on the
-- script's clock). A lease whose expiry has come (score <= now) is dropped
-- first, never one before. An id already held is refreshed and taken again
-- (a retried call). An id with a tombstone (its take's clean-up release came
-- first: permit_release) is not taken, and its tombstone goes. The key lives
-- as long as its latest lease.
-- KEYS[1]: the in-flight key; KEYS[2]: its tombstones (a sorted set of ids
--   scored by when the tombstone lapses). ARGV[1]: now in ms ('' for TIME);
--   ARGV[2]: the limit; ARGV[3]: the lease in ms; ARGV[4]: the lease's id.
-- Reply: {'1' taken or '0' refused, the leases held after the call, the ms
--   until the earliest held lease expires ('inf': none is held)}.
local key, now = KEYS[1], clock(ARGV[1])
local limit, lease, id = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
-- Check before writing anything: a lease expires at most 2 * MaxPause
-- (366 days) ahead of now (a lease is at most MaxPause; the rest allows for
-- clocks that disagree under WithClientClock). Anything else is foreign.
local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
if last.err then return refuse(1, 'in-flight key holds a value of another type') end
if last[2] and not ((tonumber(last[2]) or math.huge) <= now + 63244800000) then
  return refuse(1, 'in-flight key holds a lease that expires further ahead than any lease (' .. last[2] .. ')')
end
local tomb = redis.pcall('ZSCORE', KEYS[2], id)
if type(tomb) == 'table' and tomb.err then return refuse(1, 'in-flight tombstone key holds a value of another type') end
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
local ok = '0'
if tomb and tonumber(tomb) > now then
  redis.call('ZREM', KEYS[2], id) -- released before it was taken: its caller left
elseif redis.call('ZSCORE', key, id) or redis.call('ZCARD', key) < limit then
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

-- permit_renew: extend the leases a process still holds on an in-flight key
-- to now + lease. A lease whose expiry has come is not brought back: it is
-- dropped, and reported lost with those the key no longer holds.
-- KEYS[1]: the in-flight key. ARGV[1]: now in ms ('' for TIME); ARGV[2]: the
--   lease in ms; ARGV[3...]: the leases' ids.
-- Reply: the ids that were lost (expired, or gone).
local key, now, lease = KEYS[1], clock(ARGV[1]), tonumber(ARGV[2])
local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES') -- check before writing anything
if last.err then return refuse(1, 'in-flight key holds a value of another type') end
if last[2] and tonumber(last[2]) == math.huge then return refuse(1, 'in-flight key holds a lease that never expires') end
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
local lost, renewed = {}, false
for i = 3, #ARGV do
  if redis.call('ZSCORE', key, ARGV[i]) then
    redis.call('ZADD', key, 'XX', fmt(now + lease), ARGV[i])
    renewed = true
  else
    lost[#lost + 1] = ARGV[i]
  end
end
if renewed then
  last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local ttl = math.ceil(tonumber(last[2]) - now)
  if ttl < 1 then ttl = 1 end
  redis.call('PEXPIRE', key, ttl)
end
return lost

-- permit_renew: extend to now + lease the leases a process holds on an
-- in-flight key. A lease the key no longer holds (it expired while its
-- process could not reach Redis, or Redis lost it: a restart, a failover)
-- is added again while fewer than limit are held: its request is still
-- open, and the holder knows it. One that finds the key full is lost: it
-- is reported, not added. With no limit (''), every lease is added whatever
-- the key holds: the permits a failure policy granted while Redis was down,
-- still open, registered when it answers again.
-- KEYS[1]: the in-flight key. ARGV[1]: now in ms ('' for TIME); ARGV[2]: the
--   lease in ms; ARGV[3]: the limit ('': none); ARGV[4...]: the leases' ids.
-- Reply: the ids that were lost.
local key, now, lease, limit = KEYS[1], clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES') -- check before writing anything
if last.err then return refuse(1, 'in-flight key holds a value of another type') end
if last[2] and not ((tonumber(last[2]) or math.huge) <= now + 63244800000) then
  return refuse(1, 'in-flight key holds a lease that expires further ahead than any lease (' .. last[2] .. ')')
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
local lost, renewed = {}, false
for i = 4, #ARGV do
  local held, tomb = redis.call('ZSCORE', key, ARGV[i]), false
  if not held then
    tomb = redis.pcall('ZSCORE', KEYS[2], ARGV[i])
    if type(tomb) == 'table' and tomb.err then return refuse(1, 'in-flight tombstone key holds a value of another type') end
    tomb = tomb and tonumber(tomb) > now
  end
  if tomb then
    lost[#lost + 1] = ARGV[i] -- released: its holder no longer renews it
  elseif held or not limit or redis.call('ZCARD', key) < limit then
    redis.call('ZADD', key, fmt(now + lease), ARGV[i])
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

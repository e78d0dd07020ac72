-- permit_count: how many leases an in-flight key holds, those whose expiry
-- has come aside (scores in (now, +inf]). It writes nothing. A lease that
-- expires further ahead than any lease could (foreign data) is refused, as
-- permit_take refuses it, not counted.
-- KEYS[1]: the in-flight key. ARGV[1]: now in ms ('' for TIME).
-- Reply: the count.
local now = clock(ARGV[1])
local last = redis.pcall('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last.err then return refuse(1, 'in-flight key holds a value of another type') end
if last[2] and not ((tonumber(last[2]) or math.huge) <= now + 63244800000) then
  return refuse(1, 'in-flight key holds a lease that expires further ahead than any lease (' .. last[2] .. ')')
end
return fmt(redis.call('ZCOUNT', KEYS[1], '(' .. fmt(now), '+inf'))

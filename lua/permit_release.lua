-- permit_release: give back one lease of an in-flight key, if the key still
-- holds its id (an id is unique to one grant: a lease that expired and was
-- granted again under another id is untouched), and announce the release
-- on the channel, the key as payload, to the waiters of every process.
-- With a tombstone asked for (the clean-up of a take whose reply its caller
-- never read, or a release that may overtake a renewal of its lease), the id
-- is also recorded in the tombstones for a lease: a take or a renewal of it
-- arriving after its release takes nothing and adds nothing back.
-- KEYS[1]: the in-flight key; KEYS[2]: its tombstones. ARGV[1]: the lease's
--   id; ARGV[2]: the channel; ARGV[3]: '1' to leave a tombstone, else '0';
--   with '1', ARGV[4]: now in ms ('' for TIME) and ARGV[5]: the lease in ms.
-- Reply: how many leases it removed ('0' or '1').
local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) == 'table' and removed.err then return refuse(1, 'in-flight key holds a value of another type') end
if removed > 0 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
if ARGV[3] == '1' then
  local now, lease = clock(ARGV[4]), tonumber(ARGV[5])
  local r = redis.pcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
  if type(r) == 'table' and r.err then return refuse(1, 'in-flight tombstone key holds a value of another type') end
  redis.call('ZADD', KEYS[2], fmt(now + lease), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local ttl = math.ceil(tonumber(last[2]) - now)
  if ttl < 1 then ttl = 1 end
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return fmt(removed)

-- permit_release: give back leases of an in-flight key, each if the key
-- still holds its id (an id is unique to one grant: a lease that expired and
-- was granted again under another id is untouched), and announce the
-- release on the channel, the key as payload, to the waiters of every
-- process. With a tombstone asked for (the clean-up of takes whose replies
-- their callers never read, or a release that may overtake a renewal of its
-- lease), each id is also recorded in the tombstones for a lease: a take or
-- a renewal of it arriving after its release takes nothing and adds nothing
-- back. One call gives back a single lease (a Release) or every clean-up
-- due on a key (a burst of takes cut short by their deadlines).
-- KEYS[1]: the in-flight key; KEYS[2]: its tombstones. ARGV[1]: the channel;
--   ARGV[2]: '1' to leave tombstones, else '0'; ARGV[3]: now in ms ('' for
--   TIME) and ARGV[4]: the lease in ms (read with '1' only); ARGV[5..]: the
--   leases' ids, at least one.
-- Reply: how many leases it removed.
local removed = redis.pcall('ZREM', KEYS[1], unpack(ARGV, 5))
if type(removed) == 'table' and removed.err then return refuse(1, 'in-flight key holds a value of another type') end
if removed > 0 then redis.call('PUBLISH', ARGV[1], KEYS[1]) end
if ARGV[2] == '1' then
  local now, lease = clock(ARGV[3]), tonumber(ARGV[4])
  local r = redis.pcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
  if type(r) == 'table' and r.err then return refuse(1, 'in-flight tombstone key holds a value of another type') end
  local score = fmt(now + lease)
  for i = 5, #ARGV do
    redis.call('ZADD', KEYS[2], score, ARGV[i])
  end
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local ttl = math.ceil(tonumber(last[2]) - now)
  if ttl < 1 then ttl = 1 end
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return fmt(removed)

-- permit_release: give back one lease of an in-flight key, if the key still
-- holds its id (an id is unique to one grant: a lease that expired and was
-- granted again under another id is untouched), and announce the release
-- on the channel, the key as payload, to the waiters of every process.
-- KEYS[1]: the in-flight key. ARGV[1]: the lease's id; ARGV[2]: the channel.
-- Reply: how many leases it removed ('0' or '1').
local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) == 'table' and removed.err then return refuse(1, 'in-flight key holds a value of another type') end
if removed > 0 then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return fmt(removed)

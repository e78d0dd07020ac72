-- permit_count: how many leases an in-flight key holds, those whose expiry
-- has come aside (scores in (now, +inf]). It writes nothing.
-- KEYS[1]: the in-flight key. ARGV[1]: now in ms ('' for TIME).
-- Reply: the count.
local n = redis.pcall('ZCOUNT', KEYS[1], '(' .. fmt(clock(ARGV[1])), '+inf')
if type(n) == 'table' and n.err then return refuse(1, 'in-flight key holds a value of another type') end
return fmt(n)

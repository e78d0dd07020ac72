
-- reset: forget the state keys (redisstore's Reset; reset.lua's reset_keys).
-- KEYS: the state keys. ARGV: now in ms ('' for the server's TIME), then per
-- key its kind and six parameters.
reset_keys(KEYS, ARGV, 1, clock(ARGV[1]), false)
return 0

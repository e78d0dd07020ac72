-- contract: the live contract of the shapers under one prefix
-- (shaper.SetRate, SetMaxQueue), a hash: 'identity' (the configured
-- contract it changes), 'version' (grows with every change), and one field
-- per change. A change made for another configured contract replaces the
-- record; its version still grows.
-- KEYS: the record. ARGV: nothing (a read), or the identity, a field and
--   its value.
-- Reply: the record, as HGETALL gives it.
if ARGV[1] then
  if redis.call('HGET', KEYS[1], 'identity') ~= ARGV[1] then
    local v = redis.call('HGET', KEYS[1], 'version')
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'identity', ARGV[1], 'version', v or '0')
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'version', 1)
end
return redis.call('HGETALL', KEYS[1])

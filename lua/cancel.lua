
-- cancel: a tail refund per GCRA dimension (algorithms.GCRA.Cancel).
-- KEYS: state keys. ARGV: per key 3 values: tag (the TAT the reservation
-- stored), interval, cost. Reply: how many keys refunded.
local refunded = 0
for i = 1, #KEYS do
  local a = (i - 1) * 3
  local raw = get(KEYS[i])
  local st = raw and decode(raw)
  local tag = tonumber(ARGV[a + 1])
  if st and #st > 0 and st[1] == tag then
    st[1] = tag - tonumber(ARGV[a + 2]) * tonumber(ARGV[a + 3])
    redis.call('SET', KEYS[i], encode(st), 'KEEPTTL')
    refunded = refunded + 1
  end
end
return refunded

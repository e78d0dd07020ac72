
-- pause: nobody departs on these keys before now + d; a pause extends, never shortens.
-- KEYS: pause keys. ARGV[1]: now in ms ('' for TIME); ARGV[2]: d in ms.
-- Reply: the pause's end (ms) as a string.
local now = clock(ARGV[1])
local untilv = now + tonumber(ARGV[2])
for i = 1, #KEYS do
  local cur, why = get(KEYS[i])
  if cur == nil then return refuse(i, 'pause key ' .. why) end
  local curv = cur and tonumber(cur)
  if cur and not curv then return refuse(i, 'pause key holds a corrupt value') end
  if not cur or untilv > curv then
    local ttl = math.ceil(untilv - now)
    if ttl < 1 then ttl = 1 end
    redis.call('SET', KEYS[i], fmt(untilv), 'PX', ttl)
  end
end
return fmt(untilv)

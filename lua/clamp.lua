
-- clamp: a partner's count of the calls left on these keys until its reset:
-- until now + span, nothing departs on a key less than interval after the
-- previous departure reserved under the clamp (lib.lua's parse_clamp). A
-- clamp replaces the one before it, keeping its next slot if that falls
-- within its window.
-- KEYS: the state keys (a clamp lives in K:k). ARGV[1]: now in ms ('' for
--   TIME); ARGV[2]: the interval in ms; ARGV[3]: the span in ms.
-- Reply: the clamp's end (ms) as a string.
local now = clock(ARGV[1])
local interval, endv = tonumber(ARGV[2]), now + tonumber(ARGV[3])
local nexts = {}
for i = 1, #KEYS do -- read and check everything before writing anything
  local cur, why = get(KEYS[i] .. ':k')
  if cur == nil then return refuse(i, 'clamp key ' .. why) end
  nexts[i] = now
  if cur then
    local c = parse_clamp(cur)
    if not c then return refuse(i, 'clamp key holds a corrupt value') end
    if now < c[3] and c[1] > now and c[1] < c[3] then nexts[i] = c[1] end -- its next slot, within its window
  end
end
local ttl = math.ceil(endv - now)
if ttl < 1 then ttl = 1 end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i] .. ':k', fmt(nexts[i]) .. ' ' .. fmt(interval) .. ' ' .. fmt(endv), 'PX', ttl)
end
return fmt(endv)

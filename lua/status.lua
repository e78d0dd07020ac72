
-- status: the standing of N dimensions' keys at now, read without writing
-- anything (algorithms.Peek).
-- KEYS: per dimension, its state key then its pause key.
-- ARGV[1]: now in ms ('' for the server's TIME); then per dimension 8 values:
--   kind, six parameters, cost (0: the request leaves the dimension out);
--   then optionally 'any' (algorithms.PeekAny names the binding dimension).
-- Reply: {now, the longest pause's end or now, binding (0-based, -1 for the
--   pause), then per dimension its delay, remaining and reset (ms)}.
local now = clock(ARGV[1])
local n = #KEYS / 2
local dims = {}
local not_before = now
for i = 1, n do
  local a = 2 + (i - 1) * 8
  local d = {alg = ALG[ARGV[a]], cost = tonumber(ARGV[a + 7])}
  if not d.alg then return redis.error_reply('throttlekit: unknown algorithm kind ' .. tostring(ARGV[a])) end
  d.p = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
         tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])}
  if d.cost ~= 0 and (not valid_cost(d.cost) or not d.alg.admissible(d.p, d.cost)) then
    return redis.error_reply('TKCOST ' .. (i - 1) .. ' ' .. tostring(ARGV[a + 7]))
  end
  local raw, why = get(KEYS[2 * i - 1])
  if raw == nil then return refuse(i, why) end
  d.st = decode(raw)
  if not d.st then return refuse(i, 'holds a corrupt state') end
  local paused, pwhy = get(KEYS[2 * i])
  if paused == nil then return refuse(i, 'pause key ' .. pwhy) end
  if paused then
    local v = tonumber(paused)
    if not v or v ~= v then return refuse(i, 'pause key holds a corrupt value') end
    if v > not_before then not_before = v end
  end
  dims[i] = d
end
local delays, rems, resets = {}, {}, {}
for i = 1, n do
  local d = dims[i]
  delays[i] = 0
  rems[i], resets[i] = d.alg.status(d.p, d.st, now)
  if d.cost ~= 0 then delays[i] = d.alg.delay(d.p, d.st, now, d.cost) end
end
local bind
if ARGV[2 + n * 8] == 'any' then
  bind = peek_any(dims, now, not_before, delays, rems) - 1
else
  local wait, binding = pick(dims, now)
  bind = binding - 1
  if not_before - now > wait then bind = -1 end
end
local reply = {fmt(now), fmt(not_before), tostring(bind)}
for i = 1, n do
  reply[#reply + 1] = fmt(delays[i])
  reply[#reply + 1] = fmt(rems[i])
  reply[#reply + 1] = fmt(resets[i])
end
return reply

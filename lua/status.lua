
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
local dims, not_before = read_dims(KEYS, ARGV, now, true, nil)
if not dims then return not_before end
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


-- status: the standing of N dimensions' keys at now, read without writing
-- anything (algorithms.Peek), bounded by the partners' clamps on them.
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
-- A partner's clamp in force (read_dims: d.clamp), as shaper's clampFigures:
-- a clamped key is not cold before its reset, and when a key the request
-- departs on is clamped, at most one request departs at once: every
-- dimension it departs on (under 'any', those whose delay is within its
-- wait) has at most 1 remaining.
local wait = math.huge
if ARGV[2 + n * 8] == 'any' then
  for i = 1, n do
    if dims[i].cost ~= 0 and delays[i] < wait then wait = delays[i] end
  end
  if not_before - now > wait then wait = not_before - now end
end
local held = false
for i = 1, n do
  local c = dims[i].clamp
  if c then
    local r = c[3] - now
    if r > resets[i] then resets[i] = r end
    if dims[i].cost ~= 0 and delays[i] <= wait then held = true end
  end
end
if held then
  for i = 1, n do
    if dims[i].cost ~= 0 and delays[i] <= wait and rems[i] > 1 then rems[i] = 1 end
  end
end
local reply = {fmt(now), fmt(not_before), tostring(bind)}
for i = 1, n do
  reply[#reply + 1] = fmt(delays[i])
  reply[#reply + 1] = fmt(rems[i])
  reply[#reply + 1] = fmt(resets[i])
end
return reply

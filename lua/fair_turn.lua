-- fair_turn: internal/fair's State.Turn on one key, operation for operation
-- (the Go is the reference; see its comments). The key is a hash: 'v' (V),
-- 'n' (the counter), 'r' (the run over a lower class), and per flow
-- 'f' .. name = "finish until priority seq". A call that finds nobody
-- waiting starts the key over; a call after which nobody waits deletes it,
-- and it expires 10 s after its last flow's TTL otherwise.
-- KEYS[1]: the key. ARGV[1]: now in ms ('' for TIME); ARGV[2]: the TTL ms;
--   ARGV[3]: MaxRun; then per candidate 5 values:
--   name, weight, priority, cost, and 'w' (waiting), 'l' (last) or 'x'
--   (leaving).
-- Reply: {granted candidate (0-based, '-1': none), the turn's start, V,
--   then each candidate's finish tag, then each candidate's seq}.
local key, now = KEYS[1], clock(ARGV[1])
local ttl, maxrun = tonumber(ARGV[2]), tonumber(ARGV[3])
local raw = redis.pcall('HGETALL', key) -- check before writing anything
if raw.err then return refuse(1, 'fair key holds a value of another type') end
local V, N, Run = 0, 0, 0
local flows = {}
local function num(s)
  local x = tonumber(s)
  if not x or x ~= x or x == math.huge or x == -math.huge then return nil end
  return x
end
for i = 1, #raw, 2 do
  local k, val = raw[i], raw[i + 1]
  local x = nil
  if k == 'v' or k == 'n' or k == 'r' then
    x = num(val)
    if not x then return refuse(1, 'fair key holds a corrupt value') end
  end
  if k == 'v' then V = x
  elseif k == 'n' then N = x
  elseif k == 'r' then Run = x
  elseif string.sub(k, 1, 1) == 'f' then
    local a, b, c, d = string.match(val, '^(%S+) (%S+) (%S+) (%S+)$')
    local f = {finish = num(a), untl = num(b), prio = num(c), seq = num(d)}
    if not (f.finish and f.untl and f.prio and f.seq) then return refuse(1, 'fair key holds a corrupt flow') end
    flows[string.sub(k, 2)] = f
  else
    return refuse(1, 'fair key holds an unknown field')
  end
end
local dropped = {}
local function anyone_waits() -- fair.State.Active
  for _, f in pairs(flows) do
    if f.untl >= now then return true end
  end
  return false
end
local fresh = not anyone_waits() -- the key starts over, as if it had expired
if fresh then
  V, N, Run, flows = 0, 0, 0, {}
end
local function start(f) if V > f.finish then return V end return f.finish end
local function before(a, b)
  if a.prio ~= b.prio then return a.prio > b.prio end
  local sa, sb = start(a), start(b)
  if sa ~= sb then return sa < sb end
  return a.seq < b.seq
end
for name, f in pairs(flows) do
  if f.untl < now and f.finish <= V then
    flows[name] = nil
    dropped[#dropped + 1] = name
  end
end
local n = (#ARGV - 3) / 5
local names, own = {}, {}
local asks = false
for i = 1, n do
  local b = 3 + (i - 1) * 5
  local name, flag = ARGV[b + 1], ARGV[b + 5]
  names[i] = name
  local f = flows[name]
  if flag == 'x' then
    if f then
      f.untl = 0
      if f.finish <= V then
        flows[name] = nil
        dropped[#dropped + 1] = name
      end
    end
  else
    if not f then
      N = N + 1
      f = {finish = 0, untl = 0, prio = 0, seq = N}
      flows[name] = f
    end
    f.prio = tonumber(ARGV[b + 3])
    f.untl = now + ttl
    own[i] = f
    asks = true
  end
end
local granted, st = -1, 0
if asks then
  local best = nil
  for _, f in pairs(flows) do
    if f.untl >= now and (best == nil or before(f, best)) then best = f end
  end
  if best then
    local starved = false
    if maxrun > 0 and Run >= maxrun then
      local low = nil
      for _, f in pairs(flows) do
        if f.untl >= now and f.prio < best.prio and (low == nil or f.seq < low.seq) then low = f end
      end
      if low then best, starved = low, true end
    end
    local at = -1
    for i = 1, n do
      if own[i] and own[i] == best then at = i end
    end
    if at > 0 then
      local f, b = own[at], 3 + (at - 1) * 5
      st = start(f)
      f.finish = st + tonumber(ARGV[b + 4]) / tonumber(ARGV[b + 2])
      V = st
      N = N + 1
      f.seq = N
      local lower = false
      for _, g in pairs(flows) do
        if g.untl >= now and g.prio < f.prio then
          lower = true
          break
        end
      end
      if starved or not lower then Run = 0 else Run = Run + 1 end
      if ARGV[b + 5] == 'l' then f.untl = 0 end
      granted = at - 1
    end
  end
end
local reply = {tostring(granted), fmt(st), fmt(V)}
for i = 1, n do
  local f = flows[names[i]]
  if f then reply[#reply + 1] = fmt(f.finish) else reply[#reply + 1] = fmt(0) end
end
for i = 1, n do
  local f = flows[names[i]]
  if f then reply[#reply + 1] = fmt(f.seq) else reply[#reply + 1] = fmt(0) end
end
local life = 0 -- the key lives as long as a flow waits
for _, f in pairs(flows) do
  if f.untl >= now and f.untl - now > life then life = f.untl - now end
end
if not anyone_waits() then
  redis.call('DEL', key)
  return reply
end
if fresh then
  redis.call('DEL', key)
elseif #dropped > 0 then
  local args = {}
  for i = 1, #dropped do args[i] = 'f' .. dropped[i] end
  redis.call('HDEL', key, unpack(args))
end
local set = {'v', fmt(V), 'n', fmt(N), 'r', fmt(Run)}
for name, f in pairs(flows) do
  set[#set + 1] = 'f' .. name
  set[#set + 1] = fmt(f.finish) .. ' ' .. fmt(f.untl) .. ' ' .. fmt(f.prio) .. ' ' .. fmt(f.seq)
end
redis.call('HSET', key, unpack(set))
-- Expired or not once nobody waits, the key starts over (fresh): it is
-- kept a while longer, so that a late call finds what a call on time would.
redis.call('PEXPIRE', key, math.ceil(life) + 10000)
return reply

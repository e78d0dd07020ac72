-- ThrottleKit's algorithms in Lua: a line-for-line port of package algorithms.
-- Every arithmetic operation happens in the same order as in Go, where every
-- product that is added is rounded on its own (Go wraps it in float64()), so
-- that Go and Redis compute bit-identical numbers. Numbers enter and leave as
-- %.17g strings. Arrays are 1-based here and 0-based in Go: st[1] here is st[0]
-- there.

local floor = math.floor

-- batch_time is the server's TIME read once for all the reservations of a
-- batch (reserve_batch.lua), which are decided at one instant; nil (every
-- other script): each script reads TIME itself. read_keys and write_tat are
-- reserve_gcra.lua's reads and writes, which a batch defines.
local batch_time, read_keys, write_tat = nil, nil, nil

local function fmt(x) return string.format('%.17g', x) end

-- decode parses a stored state; it returns nil for text that is not a list
-- of finite numbers (a corrupt state, never written by these scripts).
local function decode(s)
  local st = {}
  if s then
    for w in string.gmatch(s, '%S+') do
      local x = tonumber(w)
      if not x or x ~= x or x == math.huge or x == -math.huge then return nil end
      st[#st + 1] = x
    end
  end
  return st
end

-- get reads a key that must hold a string (or nothing). It returns the value
-- (false for none), or nil and the reason when another type is stored there:
-- such a key is never read as state, and never overwritten.
local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return nil, 'holds a value of another type' end
  return v
end

-- refuse is the error reply for the data of dimension i (1-based): the
-- caller maps it to the user's key and dimension.
local function refuse(i, why) return redis.error_reply('TKSTATE ' .. (i - 1) .. ' ' .. why) end

-- valid_cost: a whole number from 1 to 2^53 (the ALG's own limit is checked
-- by its admissible()).
local function valid_cost(c) return c and c >= 1 and c <= 9007199254740992 and c == floor(c) end

local function encode(st)
  local out = {}
  for i = 1, #st do out[i] = fmt(st[i]) end
  return table.concat(out, ' ')
end

local function floor_mod(a, b) return a - floor(a / b) * b end

-- GCRA and the leaky-bucket shaper: p = {interval, tau, maxWait}; st = {tat}.
-- Decisions are relative to now (ahead = how far the TAT lies after now).
local gcra = {}
local function gcra_ahead(st, now)
  if #st > 0 and st[1] > now then return st[1] - now end
  return 0
end
function gcra.admissible(p, cost) return (p[1] * cost) - p[2] <= p[3] end
function gcra.delay(p, st, now, cost)
  local w = (gcra_ahead(st, now) + p[1] * cost) - p[2]
  if w > 0 then return w end
  return 0
end
-- gcra_up is the next float above x (Go's math.Nextafter(x, +Inf)): for
-- x = m*2^e with 0.5 <= |m| < 1 the step above x is 2^(e-53), one binade
-- lower for a negative power of two, and 2^-1074 among subnormals.
local function gcra_up(x)
  if x == 0 then return math.ldexp(1, -1074) end
  local m, e = math.frexp(x)
  if m == -0.5 then e = e - 1 end
  if e < -1021 then e = -1021 end
  return x + math.ldexp(1, e - 53)
end
-- gcra_sum_up is now + (base + tc) rounded up, as gcra.sumUp: both sums
-- rounded to nearest with their exact errors (TwoSum); when the errors add
-- up to more than 0 the sum lost something and the next float above is
-- taken. Inlined, operation for operation, in reserve_gcra.lua.
local function gcra_sum_up(now, base, tc)
  local y = base + tc
  local yb = y - base
  local e = (base - (y - yb)) + (tc - yb)
  local r = now + y
  local rb = r - now
  local err = (now - (r - rb)) + (y - rb)
  if err + e > 0 then r = gcra_up(r) end
  return r
end
-- gcra_settle_tail mirrors gcra.Kernel.SettleTail (both terms rounded up):
-- the TAT of the reservation at a key's tail, which departs at t, settled
-- at actual units (interval, tau: its contract's).
local function gcra_settle_tail(interval, tau, tat, t, cost, actual)
  local tc, ta = interval * cost, interval * actual
  if actual == 0 then
    local r = tat + (-tc)
    local rb = r - tat
    local err = (tat - (r - rb)) + ((-tc) - rb)
    if err > 0 then r = gcra_up(r) end
    return r
  end
  local d = tc + (-ta)
  local db = d - tc
  local e = (tc - (d - db)) + ((-ta) - db)
  local r = tat + (-d)
  local rb = r - tat
  local err = (tat - (r - rb)) + ((-d) - rb)
  if err - e > 0 then r = gcra_up(r) end
  local own = ta
  if tau < own then own = tau end
  local other = gcra_sum_up(t, 0, own)
  if other > r then return other end
  return r
end
-- gcra_convert mirrors gcra.Kernel.Convert: a TAT stored under interval
-- sint and tolerance stau, read under p = {interval, tau} at now.
local function gcra_convert(p, tat, now, sint, stau)
  if (sint == p[1] and stau == p[2]) or not (tat > now) then return tat end
  return (tat - (stau - sint)) + (p[2] - p[1])
end
function gcra.commit(p, st, now, delay, cost)
  local tc = p[1] * cost
  local excess = tc - p[2]
  if excess < 0 then excess = 0 end
  local base = gcra_ahead(st, now)
  local v = delay - excess
  if v > base then base = v end
  return {gcra_sum_up(now, base, tc)}
end
function gcra.status(p, st, now)
  local tat = now
  if #st > 0 and st[1] > now then tat = st[1] end
  return ((now + p[2]) - tat) / p[1], tat - now
end
function gcra.max_wait(p) return p[3] end

-- gcra_read returns the state {tat} of a GCRA key stored as {tat} (read as
-- it is) or {tat, interval, tau}, the contract it was stored under: one
-- stored under another contract (changed live) is converted as
-- gcra.Kernel.Convert converts it; nil for a state of another shape.
local function gcra_read(p, st, now)
  if #st == 1 then return st end
  if #st ~= 3 or not (st[2] > 0) then return nil end
  return {gcra_convert(p, st[1], now, st[2], st[3])}
end

-- gcra_encode is the stored form of a GCRA state under p: the TAT and the
-- contract it was stored under (see gcra_read).
local function gcra_encode(p, st) return fmt(st[1]) .. ' ' .. fmt(p[1]) .. ' ' .. fmt(p[2]) end

-- Token bucket: p = {interval, burst, count, period}; st = {credit, last,
-- period}, credit = tokens * period (ms): a refill adds elapsed * count, a
-- request takes cost * period, exact in whole milliseconds. A state of
-- another period, or of the layout {tokens, last}, is read through its tokens.
local token = {}
local function token_level(p, st, now)
  local cap = p[2] * p[4]
  if #st < 2 then return cap, now end
  local credit, last = st[1], st[2]
  if #st < 3 then
    credit = credit * p[4]
  elseif st[3] ~= p[4] then
    credit = (credit / st[3]) * p[4]
  end
  local elapsed = now - last
  if elapsed > 0 then
    credit = credit + elapsed * p[3]
    last = now
  end
  if credit > cap then credit = cap end -- a burst lowered live holds at once
  return credit, last
end
function token.admissible(p, cost) return cost <= p[2] end
function token.delay(p, st, now, cost)
  local credit = token_level(p, st, now)
  local need = cost * p[4]
  if credit >= need then return 0 end
  return (need - credit) / p[3]
end
function token.commit(p, st, now, delay, cost)
  local credit, last = token_level(p, st, now)
  return {credit - cost * p[4], last, p[4]}
end
function token.status(p, st, now)
  local credit, last = token_level(p, st, now)
  return credit / p[4], (last - now) + (p[2] * p[4] - credit) / p[3]
end
function token.max_wait(p) return 0 end

-- Fixed window: p = {limit, window}; st = {start, count}.
local fixed = {}
local function fixed_current(p, st, now)
  local start = floor(now / p[2]) * p[2]
  if #st < 2 or start > st[1] then return start, 0 end
  return st[1], st[2]
end
function fixed.admissible(p, cost) return cost <= p[1] end
function fixed.delay(p, st, now, cost)
  local start, count = fixed_current(p, st, now)
  if count + cost <= p[1] then return 0 end
  return (start + p[2]) - now
end
function fixed.commit(p, st, now, delay, cost)
  local start, count = fixed_current(p, st, now)
  return {start, count + cost}
end
function fixed.status(p, st, now)
  local start, count = fixed_current(p, st, now)
  if count == 0 then return p[1], 0 end
  return p[1] - count, (start + p[2]) - now
end
function fixed.max_wait(p) return 0 end

-- Sliding window: p = {limit, width, n}; st = {idx, count newest, ..., count n before}.
local sliding = {}
local function sw_view(p, st, now)
  local n = p[3]
  local idx = floor(now / p[2])
  if #st < n + 2 then return idx, n + 1, (now - idx * p[2]) / p[2] end
  if idx < st[1] then return st[1], 0, 0 end
  return idx, idx - st[1], (now - idx * p[2]) / p[2]
end
local function sw_count(p, st, shift, age)
  local n = p[3]
  local j = age - shift
  if j < 0 or j > n or #st < n + 2 then return 0 end
  return st[2 + j]
end
local function sw_estimate(p, st, shift, frac)
  local full = 0
  for age = 0, p[3] - 1 do full = full + sw_count(p, st, shift, age) end
  return full + sw_count(p, st, shift, p[3]) * (1 - frac)
end
function sliding.admissible(p, cost) return cost <= p[1] end
function sliding.delay(p, st, now, cost)
  local limit, width, n = p[1], p[2], p[3]
  local idx, shift, frac = sw_view(p, st, now)
  if sw_estimate(p, st, shift, frac) + cost <= limit then return 0 end
  for j = 0, n do
    local full = 0
    for age = 0, n - j - 1 do full = full + sw_count(p, st, shift, age) end
    if full + cost <= limit then
      local start = 0
      if j == 0 then start = frac end
      local need = start
      local old = sw_count(p, st, shift, n - j)
      if old > 0 then
        local f = 1 - (limit - cost - full) / old
        if f > need then need = f end
      end
      if j == 0 and need == frac then return 0 end
      return ((idx + j) * width + need * width) - now
    end
  end
  return math.huge -- unreachable for a valid cost: never admitted
end
function sliding.commit(p, st, now, delay, cost)
  local n = p[3]
  local idx, shift = sw_view(p, st, now)
  local out = {}
  if #st < n + 2 then
    for i = 1, n + 2 do out[i] = 0 end
  else
    local k = shift
    if k > n + 1 then k = n + 1 end
    for i = 1, n + 2 do out[i] = st[i] end
    if k > 0 then
      for age = n, 0, -1 do
        if age >= k then out[2 + age] = st[2 + age - k] else out[2 + age] = 0 end
      end
    end
  end
  out[1] = idx
  out[2] = out[2] + cost
  return out
end
function sliding.status(p, st, now)
  local n = p[3]
  local idx, shift, frac = sw_view(p, st, now)
  for age = 0, n do
    if sw_count(p, st, shift, age) > 0 then
      local ends = (idx - age + (n + 1)) * p[2] - now
      return p[1] - sw_estimate(p, st, shift, frac), ends
    end
  end
  return p[1], 0
end
function sliding.max_wait(p) return 0 end

-- Sliding log: p = {limit, window}; st = {total, ts1, cost1, ts2, cost2, ...}.
local slog = {}
-- live_from returns the index of a log's first entry still in its window
-- at now and the live entries' total; the entries start at index first,
-- st[1] is their total (algorithms.liveFrom).
local function live_from(st, first, window, now)
  local used = st[1]
  while first + 1 <= #st and st[first] + window <= now do
    used = used - st[first + 1]
    first = first + 2
  end
  return first, used
end
local function log_live(p, st, now)
  if #st == 0 then return 2, 0 end
  return live_from(st, 2, p[2], now)
end
function slog.admissible(p, cost) return cost <= p[1] end
function slog.delay(p, st, now, cost)
  local first, used = log_live(p, st, now)
  if used + cost <= p[1] then return 0 end
  for i = first, #st - 1, 2 do
    used = used - st[i + 1]
    if used + cost <= p[1] then return (st[i] + p[2]) - now end
  end
  return math.huge -- unreachable for a valid cost: never admitted
end
function slog.commit(p, st, now, delay, cost)
  local first, used = log_live(p, st, now)
  if #st == 0 then return {cost, now, cost} end
  local out = {used + cost}
  for i = first, #st do out[#out + 1] = st[i] end
  local n = #out
  if n >= 3 and out[n - 1] >= now then
    out[n] = out[n] + cost
    return out
  end
  out[n + 1] = now
  out[n + 2] = cost
  return out
end
-- give_back takes units off the entry of a log stamped at, never below
-- zero; the log's entries start at index first, st[1] is their total
-- (algorithms.SlidingLog.GiveBack, TrailingLog.GiveBack).
local function give_back(st, first, at, units)
  if units <= 0 then return st end
  for i = first, #st - 1, 2 do
    if st[i] == at then
      local g = math.min(units, st[i + 1])
      st[i + 1] = st[i + 1] - g
      st[1] = st[1] - g
      return st
    end
  end
  return st
end
function slog.give_back(p, st, _, at, units) return give_back(st, 2, at, units) end
function slog.status(p, st, now)
  local first, used = log_live(p, st, now)
  if used == 0 then return p[1], 0 end
  return p[1] - used, (st[#st - 1] + p[2]) - now
end
function slog.max_wait(p) return 0 end

-- Trailing log (algorithms.TrailingLog): p = {limit, window (the partner's
-- plus the spread), max wait, interval, tolerance, credit}; st = {total,
-- pace, undo, ts1, cost1, ...}.
local trail = {}
local function trail_live(p, st, t)
  if #st < 3 then return 4, 0 end
  return live_from(st, 4, p[2], t)
end
function trail.admissible(p, cost) return cost <= p[1] end
function trail.delay(p, st, now, cost)
  local base = now
  if #st >= 3 then
    local pace = st[2] - math.max(p[5] - cost * p[4], 0)
    if pace > base then base = pace end
  end
  if #st >= 5 and st[#st - 1] > base then base = st[#st - 1] end
  local first, used = trail_live(p, st, base)
  if used + cost <= p[1] then return base - now end
  for i = first, #st - 1, 2 do
    used = used - st[i + 1]
    if used + cost <= p[1] then return (st[i] + p[2]) - now end
  end
  return math.huge -- unreachable for a valid cost
end
function trail.commit(p, st, now, delay, cost)
  local at = now + delay
  if #st < 3 then return {cost, at + cost * p[4], at, at, cost} end
  local first, used = trail_live(p, st, now)
  local credit = p[5]
  if #st >= 5 and st[#st - 1] > at - p[4] * p[1] / 10 then credit = p[6] end
  local before = st[2]
  local out = {used + cost, math.max(before, at - credit) + cost * p[4], st[3]}
  for i = first, #st do out[#out + 1] = st[i] end
  local n = #out
  if n >= 5 and out[n - 1] >= at then
    out[n] = out[n] + cost
    return out
  end
  out[3] = before
  out[n + 1] = at
  out[n + 2] = cost
  return out
end
function trail.status(p, st, now)
  local _, used = trail_live(p, st, now)
  local reset = 0
  if #st >= 3 then reset = math.max(st[2] - now, 0) end
  if #st >= 5 and used > 0 then reset = math.max(reset, (st[#st - 1] + p[2]) - now) end
  return p[1] - used, reset
end
function trail.max_wait(p) return p[3] end
function trail.give_back(p, st, _, at, units)
  if #st < 3 then return st end
  local before = st[1]
  st = give_back(st, 4, at, units)
  local g = (before - st[1]) * p[4]
  local n = #st
  if n >= 5 and st[n - 1] == at and st[n] == 0 then
    st[n] = nil
    st[n - 1] = nil
    n = n - 2
    while n >= 5 and st[n] == 0 do -- empty entries left newest: no departures
      st[n] = nil
      st[n - 1] = nil
      n = n - 2
    end
    local bound = 0
    if n >= 5 then bound = st[n - 1] + math.max(st[n] * p[4], p[5]) end
    st[2] = math.min(math.min(st[2] - g, st[3]), bound)
    return st
  end
  st[2] = st[2] - g
  st[3] = st[3] - g
  return st
end

-- Cost bucket (algorithms.CostBucket): p = {capacity, interval (ms a
-- unit), max wait}; st = {level after the newest departure, the newest
-- departure, then per departure still ahead: departure, cost, and the
-- level and instant before it}.
local cbucket = {}
local function cb_level(p, st, t) return math.min(p[1], st[1] + (t - st[2]) / p[2]) end
local function cb_keep_ahead(st, now)
  local i = 3
  while i + 3 <= #st and st[i] <= now do i = i + 4 end
  local out = {st[1], st[2]}
  for j = i, #st do out[#out + 1] = st[j] end
  return out
end
local function cb_replay(p, st, i, lvl, t)
  while i + 3 <= #st do
    st[i + 2] = lvl
    st[i + 3] = t
    lvl = math.min(p[1], lvl + (st[i] - t) / p[2]) - st[i + 1]
    t = st[i]
    i = i + 4
  end
  st[1] = lvl
  st[2] = t
  return st
end
function cbucket.admissible(p, cost) return cost <= p[1] end
function cbucket.delay(p, st, now, cost)
  if #st < 2 then return 0 end
  local base = math.max(now, st[2])
  local lvl = cb_level(p, st, base)
  if lvl >= cost then return base - now end
  return (base + (cost - lvl) * p[2]) - now
end
function cbucket.commit(p, st, now, delay, cost)
  local at = now + delay
  if #st < 2 then
    if at > now then return {p[1] - cost, at, at, cost, p[1], at} end
    return {p[1] - cost, at}
  end
  if st[2] > at then at = st[2] end
  local lvl, t = st[1], st[2]
  local out = cb_keep_ahead(st, now)
  out[1] = math.min(p[1], lvl + (at - t) / p[2]) - cost
  out[2] = at
  if at > now then
    local n = #out
    out[n + 1] = at
    out[n + 2] = cost
    out[n + 3] = lvl
    out[n + 4] = t
  end
  return out
end
function cbucket.give_back(p, st, now, at, units)
  if #st < 2 or units <= 0 then return st end
  st = cb_keep_ahead(st, now)
  local n = #st
  if at > now then
    for i = n - 3, 3, -4 do
      if st[i] == at and st[i + 1] == units then -- cancelled before it left
        local lvl, t = st[i + 2], st[i + 3]
        local out = {}
        for j = 1, i - 1 do out[j] = st[j] end
        for j = i + 4, n do out[#out + 1] = st[j] end
        return cb_replay(p, out, i, lvl, t)
      end
    end
  end
  if n == 2 then
    st[1] = math.min(p[1], cb_level(p, st, now) + units)
    st[2] = now
    return st
  end
  local lvl = math.min(p[1], st[5] + (now - st[6]) / p[2])
  return cb_replay(p, st, 3, math.min(p[1], lvl + units), now)
end
function cbucket.status(p, st, now)
  if #st < 2 then return p[1], 0 end
  local base = math.max(now, st[2])
  local full = st[2] + (p[1] - st[1]) * p[2]
  return math.max(cb_level(p, st, base), 0), math.max(full - now, 0)
end
function cbucket.max_wait(p) return p[3] end

-- Civil dates (Howard Hinnant's algorithms), as in algorithms/civil.go.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = m - 3
  if m <= 2 then mp = m + 9 end
  local doy = floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local d = doy - floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- Quota: p = {limit, cadence (1 day, 2 week, 3 month, 4 fixed), offset, weekday, period, anchor};
-- st = {start, used, end}.
local quota = {}
local DAY = 86400000
local function quota_bounds(p, t)
  local kind, offset = p[2], p[3]
  if kind == 4 then
    local start = p[6] + floor((t - p[6]) / p[5]) * p[5]
    return start, start + p[5]
  end
  local day = floor((t + offset) / DAY)
  local first, nxt
  if kind == 1 then
    first, nxt = day, day + 1
  elseif kind == 2 then
    first = day - floor_mod(day + 4 - p[4], 7)
    nxt = first + 7
  else
    local y, m = civil_from_days(day)
    first = days_from_civil(y, m, 1)
    if m == 12 then nxt = days_from_civil(y + 1, 1, 1) else nxt = days_from_civil(y, m + 1, 1) end
  end
  return first * DAY - offset, nxt * DAY - offset
end
local function quota_current(p, st, now)
  if #st == 3 and now < st[3] then return st[1], st[2], st[3] end
  local start, ends = quota_bounds(p, now)
  return start, 0, ends
end
function quota.admissible(p, cost) return cost <= p[1] end
function quota.delay(p, st, now, cost)
  local start, used, ends = quota_current(p, st, now)
  if used + cost <= p[1] then return 0 end
  return ends - now
end
function quota.commit(p, st, now, delay, cost)
  local start, used, ends = quota_current(p, st, now)
  return {start, used + cost, ends}
end
function quota.status(p, st, now)
  local start, used, ends = quota_current(p, st, now)
  if used == 0 then return p[1], 0 end
  return p[1] - used, ends - now
end
function quota.max_wait(p) return 0 end

local ALG = {g = gcra, t = token, f = fixed, s = sliding, l = slog, q = quota, w = trail, b = cbucket}

-- The time of the decision: the caller's (ARGV) or the server's (TIME).
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = batch_time or redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- headroom is how many requests of d's cost d has left at now.
local function headroom(d, now)
  local rem = d.alg.status(d.p, d.st, now)
  return rem / d.cost
end

-- pick mirrors algorithms' pick: the wait of dims at now and the binding
-- dimension (1-based): the latest delay; on a tie, the fewest requests of
-- its cost left, then the first. A dimension of cost 0 takes no part.
local function pick(dims, now)
  local wait, binding, room = -1, 1, nil
  for i = 1, #dims do
    local d = dims[i]
    if d.cost ~= 0 then
      local w = d.alg.delay(d.p, d.st, now, d.cost)
      if w > wait then
        wait, binding, room = w, i, nil
      elseif w == wait then
        if room == nil then room = headroom(dims[binding], now) end
        local h = headroom(d, now)
        if h < room then binding, room = i, h end
      end
    end
  end
  if wait < 0 then wait = 0 end
  return wait, binding
end

-- read_dims reads the dimensions of Reserve and Status from their KEYS and
-- ARGV (passed: a batch runs Reserve on a part of its own): from ARGV[2] on,
-- each one's kind, six parameters and cost, all checked before any key is
-- read (with zero_ok a cost of 0 leaves the dimension out); then each one's
-- state (KEYS[2i-1]) and pause (KEYS[2i]). extra(i, d), if given, reads
-- what else a dimension needs and returns an error reply, or nil. It
-- returns the dimensions and the latest pause's end (now when none), or nil
-- and the error reply.
-- A partner's clamp on a key K lives in K:k as "next interval end" (ms):
-- while now < end, nothing departs on K before min(next, end), and each
-- departure before end moves next to max(next, departure) + interval
-- (shaper.Shaper.Clamp).
local function parse_clamp(raw)
  local a, b, c = string.match(raw, '^(%S+) (%S+) (%S+)$')
  local v = {tonumber(a), tonumber(b), tonumber(c)}
  if not (v[1] and v[2] and v[3]) or v[1] ~= v[1] or v[2] ~= v[2] or v[3] ~= v[3] then return nil end
  return v
end

-- advance_clamp moves clamp c of key ck past a departure before its reset
-- (one after it is the next window's; see parse_clamp).
local function advance_clamp(ck, c, now, departure)
  if departure >= c[3] then return end
  local nextv = c[1]
  if departure > nextv then nextv = departure end
  nextv = nextv + c[2]
  local ttl = math.ceil(c[3] - now)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', ck, fmt(nextv) .. ' ' .. fmt(c[2]) .. ' ' .. fmt(c[3]), 'PX', ttl)
end

local function read_dims(KEYS, ARGV, now, zero_ok, extra)
  local n = #KEYS / 2
  local dims = {}
  for i = 1, n do
    local a = 2 + (i - 1) * 8
    local d = {alg = ALG[ARGV[a]], cost = tonumber(ARGV[a + 7])}
    if not d.alg then return nil, redis.error_reply('throttlekit: unknown algorithm kind ' .. tostring(ARGV[a])) end
    d.p = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
           tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])}
    -- The caller checked the cost; it is checked again here, before anything
    -- is read or written, so that no version of the caller can store a cost
    -- that could never be admitted.
    if not (zero_ok and d.cost == 0) and (not valid_cost(d.cost) or not d.alg.admissible(d.p, d.cost)) then
      return nil, redis.error_reply('TKCOST ' .. (i - 1) .. ' ' .. tostring(ARGV[a + 7]))
    end
    dims[i] = d
  end
  local not_before = now
  for i = 1, n do
    local d = dims[i]
    local raw, why = get(KEYS[2 * i - 1])
    if raw == nil then return nil, refuse(i, why) end
    d.st = decode(raw)
    if not d.st then return nil, refuse(i, 'holds a corrupt state') end
    if d.alg == gcra and #d.st > 0 then -- "tat interval tau" (reserve_gcra.lua): as this contract reads it
      d.st = gcra_read(d.p, d.st, now)
      if not d.st then return nil, refuse(i, 'holds a corrupt state') end
    end
    if extra then
      local err = extra(i, d)
      if err then return nil, err end
    end
    local paused, pwhy = get(KEYS[2 * i])
    if paused == nil then return nil, refuse(i, 'pause key ' .. pwhy) end
    if paused then
      local v = tonumber(paused)
      if not v or v ~= v then return nil, refuse(i, 'pause key holds a corrupt value') end
      if v > not_before then not_before = v end
    end
    local craw, cwhy = get(KEYS[2 * i - 1] .. ':k')
    if craw == nil then return nil, refuse(i, 'clamp key ' .. cwhy) end
    if craw then
      local c = parse_clamp(craw)
      if not c then return nil, refuse(i, 'clamp key holds a corrupt value') end
      if now < c[3] then -- in force: its next slot, or its reset once what it allows is taken
        d.clamp = c
        local f = c[1]
        if c[3] < f then f = c[3] end
        if f > not_before then not_before = f end
      end
    end
  end
  return dims, not_before
end

-- all_not_before mirrors algorithms.AllNotBefore. dims[i] = {alg, p, st, cost}.
-- It returns allowed, wait-or-retry (ms), remaining, reset (ms), binding
-- (0-based, -1 for the floor) and, when allowed, the new states.
local function all_not_before(dims, now, not_before)
  local max_wait = dims[1].alg.max_wait(dims[1].p)
  for i = 2, #dims do
    local w = dims[i].alg.max_wait(dims[i].p)
    if w < max_wait then max_wait = w end
  end
  local wait, binding = pick(dims, now)
  local floored = not_before - now > wait
  if floored then wait = not_before - now end
  local b = dims[binding]
  local bind = binding - 1
  if floored then bind = -1 end
  if wait > max_wait then
    local rem, reset = b.alg.status(b.p, b.st, now)
    return false, wait - max_wait, rem, reset, bind
  end
  for i = 1, #dims do
    local d = dims[i]
    d.st = d.alg.commit(d.p, d.st, now, wait, d.cost)
  end
  local rem, reset = b.alg.status(b.p, b.st, now)
  return true, wait, rem, reset, bind
end

-- any_not_before mirrors algorithms.AnyWithin (a caller's deadline arrives
-- as the GCRA family's max_wait parameter): the request departs when some
-- dimension first admits it, and every dimension admitting it then commits.
-- It returns allowed, wait-or-retry (ms), remaining, reset (ms), binding
-- (0-based, -1 for the floor) and took (per dimension, true when it
-- committed).
local function any_not_before(dims, now, not_before)
  local max_wait = math.huge
  for i = 1, #dims do
    local w = dims[i].alg.max_wait(dims[i].p)
    if w < max_wait then max_wait = w end
  end
  local delays, took = {}, {}
  local wait, soonest = math.huge, 1
  for i = 1, #dims do
    local d = dims[i]
    delays[i] = d.alg.delay(d.p, d.st, now, d.cost)
    took[i] = false
    if delays[i] < wait then wait, soonest = delays[i], i end
  end
  local floored = not_before - now > wait
  if floored then wait = not_before - now end
  if wait > max_wait then
    local b = dims[soonest]
    local rem, reset = b.alg.status(b.p, b.st, now)
    local bind = soonest - 1
    if floored then bind = -1 end
    return false, wait - max_wait, rem, reset, bind, took
  end
  local best, room = soonest, -math.huge
  for i = 1, #dims do
    if delays[i] <= wait then
      local h = headroom(dims[i], now)
      if h > room then best, room = i, h end
    end
  end
  for i = 1, #dims do
    if delays[i] <= wait then
      local d = dims[i]
      d.st = d.alg.commit(d.p, d.st, now, wait, d.cost)
      took[i] = true
    end
  end
  local b = dims[best]
  local rem, reset = b.alg.status(b.p, b.st, now)
  local bind = best - 1
  if floored then bind = -1 end
  return true, wait, rem, reset, bind, took
end

-- peek_any mirrors algorithms.PeekAny's binding (1-based, 0 for the floor),
-- given each dimension's delay and remaining (dimensions of cost 0 aside).
local function peek_any(dims, now, not_before, delays, rems)
  local wait, soonest, max_wait = math.huge, 1, math.huge
  for i = 1, #dims do
    local d = dims[i]
    if d.cost ~= 0 then
      local w = d.alg.max_wait(d.p)
      if w < max_wait then max_wait = w end
      if delays[i] < wait then wait, soonest = delays[i], i end
    end
  end
  if not_before - now > wait then return 0 end
  if wait > max_wait then return soonest end
  local best, room = soonest, -math.huge
  for i = 1, #dims do
    if dims[i].cost ~= 0 and delays[i] <= wait then
      local h = rems[i] / dims[i].cost
      if h > room then best, room = i, h end
    end
  end
  return best
end

-- set_clamp is clamp.lua's work on the state keys KEYS[from..]: until now +
-- span, nothing departs on a key less than interval after the previous
-- departure reserved under the clamp; a clamp replaces the one before it.
-- With spread (a partner's count, clamp.lua), a replaced clamp whose next
-- slot has not come keeps holding it (or its reset, whichever is sooner),
-- but no later than the new interval after the departure before it: the
-- count is spread from the key's next slot on. Without (a learned rate,
-- a margin: learn.lua), its next slot moves to the new interval after the
-- departure before it, even past its window (granted ahead before a
-- shorter MaxQueue), and a window that would end before that slot's
-- interval is over ends a span after it instead: a pace renewed never
-- forgets the departure it spaces from. With tighter and spread (a
-- pause's resumed pace) the two clamps merge: the one spacing departures
-- further apart holds, until the later of the two ends, so that a shorter
-- pause never shortens the pace a longer one set. With tighter alone (a
-- margin, renewed), a key whose clamp in force spaces departures further
-- apart keeps it, to its own end (one as far apart is renewed: a
-- margin's own). It returns
-- the clamp's end as a string, or the error reply of a key it cannot use
-- (having written nothing). memstore's clamp is the same, bit for bit.
local function set_clamp(from, now, interval, span, tighter, spread)
  local endv = now + span
  local nexts, ends, ints, keep = {}, {}, {}, {}
  for i = from, #KEYS do -- read and check everything before writing anything
    local cur, why = get(KEYS[i] .. ':k')
    if cur == nil then return refuse(i - from + 1, 'clamp key ' .. why) end
    nexts[i], ends[i], ints[i] = now, endv, interval
    if cur then
      local c = parse_clamp(cur)
      if not c then return refuse(i - from + 1, 'clamp key holds a corrupt value') end
      if now < c[3] and c[1] > now then
        if spread then -- its hold kept, to the new interval after the departure before it at most
          local held = c[1] - c[2] + interval
          if c[3] < held then held = c[3] end
          if c[1] < held then held = c[1] end
          nexts[i] = math.max(now, held)
        else -- its next slot moved to the new interval, its window past it
          nexts[i] = math.max(now, c[1] - c[2] + interval)
          if nexts[i] + interval > endv then ends[i] = nexts[i] + span end
        end
      end
      if tighter and now < c[3] then
        if spread then -- merged: the clamp spacing further apart holds, to the later end
          if c[2] >= interval then
            keep[i] = ends[i] <= c[3]
            nexts[i], ints[i] = c[1], c[2]
          elseif c[3] > ends[i] then
            ends[i] = c[3]
          end
        else
          keep[i] = c[2] > interval
        end
      end
    end
  end
  for i = from, #KEYS do
    if not keep[i] then
      local ttl = math.ceil(ends[i] - now)
      if ttl < 1 then ttl = 1 end
      redis.call('SET', KEYS[i] .. ':k', fmt(nexts[i]) .. ' ' .. fmt(ints[i]) .. ' ' .. fmt(ends[i]), 'PX', ttl)
    end
  end
  return fmt(endv)
end

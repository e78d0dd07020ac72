-- fair_turn: internal/fair's State.Turn on one key, operation for operation
-- (the Go is the reference; see its comments), on sorted sets where the Go
-- has indexed heaps, touching only what a turn needs: O(log flows) per
-- update and turn. The keys, all in KEYS[1]'s hash slot:
--   H = KEYS[1], a hash: 'm' = "N Run X parked" (X: the keys live until
--     then, ms), 'v' .. c = class c's V: "hi lo", 'f' .. id = a flow:
--     "Fhi Flo seq owner..." (the owners registered for it),
--     'g' .. owner .. ' ' .. id = a registration: "cost weight last"; a
--     flow's id is its class, a space, its name.
--   H .. ':o', owners by the instant their wait ends; H .. ':w:' .. owner,
--     the ids an owner registered (score 0); H .. ':c', the classes with a
--     flow waiting, H .. ':k', every class seen (score and member the
--     class); per class c, H .. ':s' .. c, its waiting flows by seq (member
--     the name); H .. ':e' .. c, those whose finish V has reached, by seq;
--     H .. ':t' .. c, the others, by Fhi, member enc(Flo) .. seq .. name;
--     H .. ':p' .. c, the flows no longer waiting whose finish is ahead of
--     V, by Fhi, member enc(Flo) .. id.
-- A call that finds nobody waiting starts the key over; a call after which
-- nobody waits deletes it. Data the script did not write (H of another
-- type, or a hash without 'm' that is not the older layout): refused,
-- untouched. Its own data corrupt (a value that does not parse, an owner
-- waiting past the bound, orders that disagree, the older layout): the
-- keys are deleted, so that the next call starts over, and the call is
-- refused.
-- ARGV[1]: now in ms ('' for TIME); ARGV[2]: the TTL ms; ARGV[3]: MaxRun;
--   ARGV[4]: the caller (owner); ARGV[5]: '1' fresh; ARGV[6]: '1' hold;
--   then per update 5 values: name, class, weight, cost, and 'w'
--   (waiting), 'l' (last) or 'x' (leaving).
-- Reply: {granted '1'/'0', name, class, start hi, lo, finish hi, lo,
--   V hi, lo, renewed '1'/'0'}.
local H, now = KEYS[1], clock(ARGV[1])
local ttl, maxrun, who = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local fresh, hold = ARGV[5] == '1', ARGV[6] == '1'
local MAX_TTL, MAX_PARKED = 60000, 65536
if not ttl or ttl ~= ttl or ttl < 0 or ttl > MAX_TTL or not maxrun or who == '' or string.find(who, ' ', 1, true) then
  return redis.error_reply('ERR fair_turn: bad arguments')
end
local typ = redis.call('TYPE', H)['ok']
if typ ~= 'none' and typ ~= 'hash' then return refuse(1, 'fair key holds a value of another type') end
local meta = false
if typ == 'hash' then
  meta = redis.call('HGET', H, 'm')
  if not meta then
    -- The layout before this one ('v', 'n', 'r', 'f' .. name: every field
    -- read and rewritten by each call) is the library's own: deleted and
    -- refused once, as corrupt data is. Any other hash is not ours.
    local all = redis.call('HGETALL', H)
    for i = 1, #all, 2 do
      local k = all[i]
      if k ~= 'v' and k ~= 'n' and k ~= 'r' and string.sub(k, 1, 1) ~= 'f' then
        return refuse(1, 'fair key holds a hash the library did not write')
      end
    end
    redis.call('DEL', H)
    return refuse(1, 'fair key held the turns of an older version')
  end
end
local O, C, K = H .. ':o', H .. ':c', H .. ':k'
local function W(w) return H .. ':w:' .. w end
local function P(c) return H .. ':p' .. c end
local function S(c) return H .. ':s' .. c end
local function E(c) return H .. ':e' .. c end
local function T(c) return H .. ':t' .. c end

local function bad(why) error({tk = why}) end
local touched = {} -- the keys this call wrote (their TTL is set at the end)
local function rc(...) -- redis.call: a wrong type is corruption
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then bad('a key of another type') end
  return r
end
local function wc(key, ...) touched[key] = true return rc(...) end
local function num(s)
  local x = tonumber(s)
  if not x or x ~= x or x == math.huge or x == -math.huge then return nil end
  return x
end

-- Tags (internal/fair's Tag): hi + lo exactly.
local function tag_less(ah, al, bh, bl) return ah < bh or (ah == bh and al < bl) end
local function tag_add(hi, lo, q)
  local s = hi + q
  local sb = s - hi
  local e = (hi - (s - sb)) + (q - sb)
  e = e + lo
  local h = s + e
  local hb = h - s
  local l = (s - (h - hb)) + (e - hb)
  return h, l + 0
end
-- enc: 8 bytes whose byte order is x's numeric order (x finite, not -0).
local function enc(x)
  local s = struct.pack('>d', x)
  local b1 = string.byte(s, 1)
  if b1 >= 128 then
    local t = {}
    for i = 1, 8 do t[i] = string.char(255 - string.byte(s, i)) end
    return table.concat(t)
  end
  return string.char(b1 + 128) .. string.sub(s, 2)
end

local N, Run, X, parked = 0, 0, 0, 0
local cache = {} -- id -> flow (false: none)
local vs = {} -- class -> {hi, lo}

local function getv(cs)
  local v = vs[cs]
  if v then return v end
  local raw = rc('HGET', H, 'v' .. cs)
  v = {0, 0}
  if raw then
    local a, b = string.match(raw, '^(%S+) (%S+)$')
    v = {num(a), num(b)}
    if not (v[1] and v[2]) or v[1] < 0 then bad('a corrupt value') end
  end
  vs[cs] = v
  return v
end
local function vless(cs, f) -- V < f's finish, in f's class
  local v = getv(cs)
  return tag_less(v[1], v[2], f.hi, f.lo)
end

local function getflow(id)
  local f = cache[id]
  if f ~= nil then return f or nil end
  local v = rc('HGET', H, 'f' .. id)
  if not v then
    cache[id] = false
    return nil
  end
  local words = {}
  for w in string.gmatch(v, '%S+') do words[#words + 1] = w end
  local cs, name = string.match(id, '^(%S+) (.*)$')
  f = {id = id, cs = cs, class = num(cs), name = name, hi = num(words[1]), lo = num(words[2]), seq = num(words[3]), owners = {}}
  if not (f.class and f.hi and f.lo and f.seq) or f.hi < 0 then bad('a corrupt flow') end
  for i = 4, #words do f.owners[#f.owners + 1] = words[i] end
  cache[id] = f
  return f
end
local function putflow(f)
  local v = fmt(f.hi) .. ' ' .. fmt(f.lo) .. ' ' .. fmt(f.seq)
  if #f.owners > 0 then v = v .. ' ' .. table.concat(f.owners, ' ') end
  wc(H, 'HSET', H, 'f' .. f.id, v)
end
local function delflow(f)
  wc(H, 'HDEL', H, 'f' .. f.id)
  cache[f.id] = false
end
local function tmember(f) return enc(f.lo) .. string.format('%016.0f', f.seq) .. f.name end
local function pmember(f) return enc(f.lo) .. f.id end
local function regof(f, w)
  for i, o in ipairs(f.owners) do
    if o == w then return i end
  end
  return nil
end

local function wait(f) -- State.wait
  if wc(P(f.cs), 'ZREM', P(f.cs), pmember(f)) == 1 then parked = parked - 1 end
  wc(C, 'ZADD', C, f.cs, f.cs)
  wc(K, 'ZADD', K, f.cs, f.cs)
  wc(S(f.cs), 'ZADD', S(f.cs), f.seq, f.name)
  if vless(f.cs, f) then
    wc(T(f.cs), 'ZADD', T(f.cs), f.hi, tmember(f))
  else
    wc(E(f.cs), 'ZADD', E(f.cs), f.seq, f.name)
  end
end
local function unwait(f) -- State.unwait
  wc(S(f.cs), 'ZREM', S(f.cs), f.name)
  wc(E(f.cs), 'ZREM', E(f.cs), f.name)
  wc(T(f.cs), 'ZREM', T(f.cs), tmember(f))
  if rc('ZCARD', S(f.cs)) == 0 then wc(C, 'ZREM', C, f.cs) end
  if not vless(f.cs, f) then
    delflow(f)
    return
  end
  wc(P(f.cs), 'ZADD', P(f.cs), f.hi, pmember(f))
  putflow(f)
  parked = parked + 1
  if parked > MAX_PARKED then -- the class's parked flow V reaches first is forgotten
    local m = rc('ZRANGE', P(f.cs), 0, 0)[1]
    local g = getflow(string.sub(m, 9))
    if not g then bad('a parked flow that does not exist') end
    wc(P(f.cs), 'ZREM', P(f.cs), m)
    parked = parked - 1
    delflow(g)
  end
end
local function unreg(w, f) -- State.unreg
  local i = regof(f, w)
  if i then table.remove(f.owners, i) end
  wc(H, 'HDEL', H, 'g' .. w .. ' ' .. f.id)
  wc(W(w), 'ZREM', W(w), f.id)
  if #f.owners == 0 then unwait(f) else putflow(f) end
end
local function drop_regs(w) -- State.dropRegs
  for _, id in ipairs(rc('ZRANGE', W(w), 0, -1)) do
    local f = getflow(id)
    if not f or not regof(f, w) then bad('an owner registered for a flow that does not know it') end
    unreg(w, f)
  end
end
local function remove_owner(w)
  wc(O, 'ZREM', O, w)
  rc('DEL', W(w))
end
local function wipe() -- every key of the state
  local owners = redis.pcall('ZRANGE', O, 0, -1)
  if type(owners) == 'table' and not owners.err then
    for _, w in ipairs(owners) do redis.call('DEL', W(w)) end
  end
  local cls = redis.pcall('ZRANGE', K, 0, -1)
  if type(cls) == 'table' and not cls.err then
    for _, c in ipairs(cls) do redis.call('DEL', S(c), E(c), T(c), P(c)) end
  end
  redis.call('DEL', H, O, C, K)
  cache, touched, vs = {}, {}, {}
end
local function best_in(cs) -- State.best
  while true do
    local t = rc('ZRANGE', T(cs), 0, 0)
    if #t == 0 then break end
    local f = getflow(cs .. ' ' .. string.sub(t[1], 25))
    if not f then bad('an order names a flow that does not exist') end
    if vless(cs, f) then break end
    wc(T(cs), 'ZREM', T(cs), t[1])
    wc(E(cs), 'ZADD', E(cs), f.seq, f.name)
  end
  local e = rc('ZRANGE', E(cs), 0, 0)
  local f
  if #e > 0 then
    f = getflow(cs .. ' ' .. e[1])
  else
    local t = rc('ZRANGE', T(cs), 0, 0)
    if #t > 0 then f = getflow(cs .. ' ' .. string.sub(t[1], 25)) end
  end
  if not f then bad('a class without flows') end
  return f
end

local function turn()
  if meta then
    local a, b, c, d = string.match(meta, '^(%S+) (%S+) (%S+) (%S+)$')
    N, Run, X, parked = num(a), num(b), num(c), num(d)
    if not (N and Run and X and parked) or parked < 0 then bad('a corrupt value') end
    local last = rc('ZRANGE', O, -1, -1, 'WITHSCORES')
    if #last > 0 and not (num(last[2]) and num(last[2]) <= now + 2 * MAX_TTL) then
      bad('an owner waiting past the bound')
    end
  end
  while true do -- the owners whose TTL passed stop waiting
    local o = rc('ZRANGE', O, 0, 0, 'WITHSCORES')
    if #o == 0 or num(o[2]) >= now then break end
    drop_regs(o[1])
    remove_owner(o[1])
  end
  if rc('ZCARD', O) == 0 then -- nobody waits: the key starts over
    wipe()
    N, Run, X, parked = 0, 0, 0, 0
  end
  local renewed = not rc('ZSCORE', O, who)
  if not renewed and fresh then drop_regs(who) end
  local n = (#ARGV - 6) / 5
  for i = 1, n do
    local b = 6 + (i - 1) * 5
    local name, cs, flag = ARGV[b + 1], ARGV[b + 2], ARGV[b + 5]
    local id = cs .. ' ' .. name
    local f = getflow(id)
    if flag == 'x' then
      if f and regof(f, who) then unreg(who, f) end
    else
      if not f then
        N = N + 1
        f = {id = id, cs = cs, class = tonumber(cs), name = name, hi = 0, lo = 0, seq = N, owners = {}}
        cache[id] = f
      end
      local last = '0'
      if flag == 'l' then last = '1' end
      wc(H, 'HSET', H, 'g' .. who .. ' ' .. id, ARGV[b + 4] .. ' ' .. ARGV[b + 3] .. ' ' .. last)
      if not regof(f, who) then
        f.owners[#f.owners + 1] = who
        wc(W(who), 'ZADD', W(who), 0, id)
      end
      putflow(f)
      if #f.owners == 1 and rc('ZSCORE', S(cs), name) == false then wait(f) end
    end
  end
  local g = {'0', '', '0', '0', '0', '0', '0', '0', '0'}
  if rc('ZCARD', W(who)) == 0 then
    remove_owner(who)
  else
    wc(O, 'ZADD', O, now + ttl, who)
    if not hold then
      local top = rc('ZRANGE', C, -1, -1)[1]
      if not top then bad('an owner waiting without a class') end
      local best = best_in(top)
      local starved = false
      if maxrun > 0 and Run >= maxrun then
        local low = nil
        for _, cs in ipairs(rc('ZRANGE', C, '-inf', '(' .. best.cs, 'BYSCORE')) do
          local m = rc('ZRANGE', S(cs), 0, 0)
          local f = m[1] and getflow(cs .. ' ' .. m[1])
          if not f then bad('a class without flows') end
          if low == nil or f.seq < low.seq then low = f end
        end
        if low then best, starved = low, true end
      end
      local r = regof(best, who) and rc('HGET', H, 'g' .. who .. ' ' .. best.id)
      if r then
        local cost, weight, last = string.match(r, '^(%S+) (%S+) (%S+)$')
        cost, weight = num(cost), num(weight)
        if not (cost and weight) or cost < 0 or weight <= 0 then bad('a corrupt registration') end
        local cs = best.cs
        wc(E(cs), 'ZREM', E(cs), best.name)
        wc(T(cs), 'ZREM', T(cs), tmember(best))
        local v = getv(cs)
        local sh, sl = v[1], v[2]
        if tag_less(sh, sl, best.hi, best.lo) then sh, sl = best.hi, best.lo end
        best.hi, best.lo = tag_add(sh, sl, cost / weight)
        vs[cs] = {sh, sl}
        wc(H, 'HSET', H, 'v' .. cs, fmt(sh) .. ' ' .. fmt(sl))
        N = N + 1
        best.seq = N
        wc(S(cs), 'ZADD', S(cs), best.seq, best.name)
        if vless(cs, best) then
          wc(T(cs), 'ZADD', T(cs), best.hi, tmember(best))
        else
          wc(E(cs), 'ZADD', E(cs), best.seq, best.name)
        end
        putflow(best)
        while true do -- forget the parked flows V has reached
          local m = rc('ZRANGE', P(cs), 0, 0)[1]
          if not m then break end
          local f = getflow(string.sub(m, 9))
          if not f then bad('a parked flow that does not exist') end
          if vless(cs, f) then break end
          wc(P(cs), 'ZREM', P(cs), m)
          parked = parked - 1
          delflow(f)
        end
        local lower = #rc('ZRANGE', C, '-inf', '(' .. best.cs, 'BYSCORE', 'LIMIT', 0, 1) > 0
        if starved or not lower then Run = 0 else Run = Run + 1 end
        g = {'1', best.name, cs, fmt(sh), fmt(sl), fmt(best.hi), fmt(best.lo), fmt(sh), fmt(sl)}
        if last == '1' then
          unreg(who, best)
          if rc('ZCARD', W(who)) == 0 then remove_owner(who) end
        end
      elseif not regof(best, who) then -- another owner's: one that waits must hold it
        local held = false
        for _, o in ipairs(best.owners) do
          if rc('ZSCORE', O, o) then held = true end
        end
        if not held then bad('a flow no owner waits for') end
      else
        bad('a registration that does not exist')
      end
    end
  end
  local reply = {g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], renewed and '1' or '0'}
  local last = rc('ZRANGE', O, -1, -1, 'WITHSCORES')
  if #last == 0 then -- nobody waits: the next call starts over
    wipe()
    return reply
  end
  -- Every key lives until X, at least 10 s past the last owner's wait:
  -- when an owner waits past it, X moves a minute on and every key is told.
  local need = num(last[2]) + 10000
  if X < need then
    X = need + 60000
    touched[H], touched[O], touched[C], touched[K] = true, true, true, true
    for _, w in ipairs(rc('ZRANGE', O, 0, -1)) do touched[W(w)] = true end
    for _, c in ipairs(rc('ZRANGE', K, 0, -1)) do
      touched[S(c)], touched[E(c)], touched[T(c)], touched[P(c)] = true, true, true, true
    end
  end
  wc(H, 'HSET', H, 'm', fmt(N) .. ' ' .. fmt(Run) .. ' ' .. fmt(X) .. ' ' .. fmt(parked))
  local life = math.ceil(X - now)
  for k in pairs(touched) do rc('PEXPIRE', k, life) end
  return reply
end

local ok, res = pcall(turn)
if ok then return res end
wipe() -- the key was ours (or empty): whatever failed, the next call starts over
if type(res) == 'table' and res.tk then return refuse(1, 'fair key holds ' .. res.tk) end
error(res)

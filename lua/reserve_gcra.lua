-- reserve_gcra: reserve.lua for one dimension of the GCRA family (the leaky
-- bucket shaper and GCRA), which is most calls. It makes the same decision
-- and stores the same TAT, with lib.lua's gcra.* math under all_not_before
-- (N = 1), operation for operation; but it defines no functions, reads both
-- keys with one MGET, and formats one number, the TAT it stores. Instead of
-- the figures it replies with the transition's inputs, as Redis gave them:
-- the caller recomputes the figures, bit for bit, with the same Go math
-- (lua.GCRAReply.Decide).
-- KEYS: the state key K, the pause key. A key with a Ledger keeps it in K:l,
--   K:h, K:b and K:c (ledger.lua), a partner's clamp in K:k, derived here: Redis refuses a command of more
--   than ten arguments before AUTH, so a reservation passes two keys.
-- ARGV: now in ms ('' for the server's TIME), interval, tau, max_wait, cost,
--   and optionally a TAT floor relative to now (ms): the key's schedule is
--   taken to run at least that far ahead (slots a failure policy granted
--   while Redis was down, which Redis never saw).
-- Reply: {allowed '1'|'0', binding '0'|'-1' (followed by 'c' while a
--   partner's clamp holds the key), TIME seconds, TIME microseconds
--   (both '' with a client clock), stored TAT or '', the floor (the pause's
--   end or the clamp's next slot, the later) or ''}; on a
--   key with a Ledger, when admitted, then 'g' and the grant's sequence
--   number, or 'h', the instant of the hole it took and the sequence number.
local now, sec, usec = nil, '', ''
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = batch_time or redis.call('TIME') -- batch_time: lib.lua's, or nil before this script alone
  sec, usec = t[1], t[2]
  now = tonumber(sec) * 1000 + tonumber(usec) / 1000
end
local interval, tau, max_wait, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tc = interval * cost
-- The caller checked the cost (the same rule as lib.lua's gcra.admissible);
-- it is checked again before anything is read or written.
if not (cost and cost >= 1 and cost <= 9007199254740992 and cost == math.floor(cost)) or tc - tau > max_wait then
  return redis.error_reply('TKCOST 0 ' .. tostring(ARGV[5]))
end
local lk = KEYS[1] .. ':l' -- the Ledger's first key; the others only for a key that has one
local ck = KEYS[1] .. ':k' -- a partner's clamp (lib.lua's parse_clamp)
local got = read_keys(KEYS[1], KEYS[2], lk, ck) -- MGET (gcra_alone.lua; a batch may answer from its last write)
local stored, paused = got[1] or '', got[2] or ''
local tat = nil
-- The state is "tat interval tau": the TAT and the contract it was stored
-- under (a bare TAT, written before contracts were recorded, is read as it
-- is). One stored under another contract (changed live) is read as this
-- one reads it: gcra.Kernel.Convert, operation for operation.
local own = ARGV[2] .. ' ' .. ARGV[3]
if got[1] then
  local raw, under = got[1], nil
  local sp = string.find(raw, ' ', 1, true)
  if sp then raw, under = string.sub(raw, 1, sp - 1), string.sub(raw, sp + 1) end
  tat = tonumber(raw)
  if not tat or tat ~= tat or tat == math.huge or tat == -math.huge then
    return redis.error_reply('TKSTATE 0 holds a corrupt state')
  end
  if under and under ~= own then
    local a, b = string.match(under, '^(%S+) (%S+)$')
    local sint, stau = tonumber(a), tonumber(b)
    if not (sint and stau) or not (sint > 0) or stau ~= stau then
      return redis.error_reply('TKSTATE 0 holds a corrupt state')
    end
    if (sint ~= interval or stau ~= tau) and tat > now then tat = (tat - (stau - sint)) + (tau - interval) end -- gcra.Kernel.Convert
  end
end -- MGET reads a key of another type as nil: the SET below refuses to overwrite it
if ARGV[6] and ARGV[6] ~= '' then
  local f = now + tonumber(ARGV[6])
  if not tat or f > tat then tat = f end
end
local ahead = 0 -- max(tat - now, 0)
if tat and tat > now then ahead = tat - now end
local wait = (ahead + tc) - tau
if wait < 0 then wait = 0 end
local bind = '0'
local floor_v = nil -- the pause's end, or the clamp's next slot, whichever is later
if got[2] then
  floor_v = tonumber(got[2])
  if not floor_v or floor_v ~= floor_v then
    return redis.error_reply('TKSTATE 0 pause key holds a corrupt value')
  end
end
local advance = nil -- with a partner's clamp in force: moves it past a departure (lib.lua's advance_clamp)
if got[4] then
  local a, b, c = string.match(got[4], '^(%S+) (%S+) (%S+)$')
  local cn, ci, ce = tonumber(a), tonumber(b), tonumber(c)
  if not (cn and ci and ce) or cn ~= cn or ci ~= ci or ce ~= ce then
    return redis.error_reply('TKSTATE 0 clamp key holds a corrupt value')
  end
  if now < ce then -- in force: its next slot, or its reset once what it allows is taken
    local f = cn
    if ce < f then f = ce end
    if not floor_v or f > floor_v then
      floor_v = f
      paused = string.format('%.17g', f)
    end
    advance = function(departure)
      if departure >= ce then return end
      local nextv = cn
      if departure > nextv then nextv = departure end
      nextv = nextv + ci
      local cttl = math.ceil(ce - now)
      if cttl < 1 then cttl = 1 end
      redis.call('SET', ck, string.format('%.17g', nextv) .. ' ' .. string.format('%.17g', ci) .. ' ' .. string.format('%.17g', ce), 'PX', cttl)
    end
  end
end
if floor_v and floor_v - now > wait then wait, bind = floor_v - now, '-1' end
if advance then bind = bind .. 'c' end -- a clamp holds the key: one request a slot (Remaining at most 1)
local led = nil
if got[3] then -- a key with a Ledger: a hole before the slot, or the slot recorded
  lk = {lk, KEYS[1] .. ':h', KEYS[1] .. ':b', KEYS[1] .. ':c'}
  led = ledger_lib()
  local l = led.decode(got[3])
  if not l then return redis.error_reply('TKSTATE 0 ledger key holds a corrupt value') end
  local bad = led.check(lk) -- before anything is written
  if bad then return redis.error_reply('TKSTATE 0 ' .. bad) end
  local floor = now
  if floor_v and floor_v > floor then floor = floor_v end
  local before = math.huge
  if wait <= max_wait then before = now + wait end
  local fits = led.fits(l, interval, tau) -- a Ledger made under another contract (changed live) is not used
  local at, seq, why = nil, nil, nil
  if fits then at, seq, why = led.take(l, lk[3], lk[2], interval, max_wait, now, floor, before, cost) end
  if why then return redis.error_reply('TKSTATE 0 ' .. why) end
  if at then
    led.save(l, lk, tat or now, now)
    if advance then advance(at) end
    return {'1', bind, sec, usec, stored, paused, 'h', string.format('%.17g', at), string.format('%.17g', seq)}
  end
  if wait <= max_wait and led.idle(lk, tat or now, now) then -- cold, no hole ahead: a fresh Ledger, numbering after the old one
    l = led.renew(l, tat, now, interval, tau)
  elseif not fits then -- busy under another contract: the key goes on without one
    if wait <= max_wait then led.drop(lk) end
    led = nil
  end
  got[3] = l
end
if wait > max_wait then
  return {'0', bind, sec, usec, stored, paused}
end
local excess = tc - tau
if excess < 0 then excess = 0 end
local base = ahead
local v = wait - excess
if v > base then base = v end
local next_tat -- now + (base + tc) rounded up: lib.lua's gcra_sum_up and gcra_up, inlined
do
  local y = base + tc
  local yb = y - base
  local e = (base - (y - yb)) + (tc - yb)
  next_tat = now + y
  local rb = next_tat - now
  if ((now - (next_tat - rb)) + (y - rb)) + e > 0 then
    local m, x = math.frexp(next_tat)
    if m == -0.5 then x = x - 1 end
    next_tat = next_tat + math.ldexp(1, x - 53)
  end
end
local ttl = math.ceil(next_tat - now) -- the time until the key is cold, as reserve.lua's status gives it
if ttl < 1 then ttl = 1 end
-- SET ... GET (Redis 6.2+) aborts, writing nothing, when the key holds another
-- type: the check costs no extra call.
local set = write_tat(KEYS[1], string.format('%.17g', next_tat) .. ' ' .. own, ttl) -- SET ... PX ttl GET, as pcall
if type(set) == 'table' and set.err then
  if string.sub(set.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('TKSTATE 0 holds a value of another type')
  end
  return redis.error_reply(set.err)
end
if advance then advance(now + wait) end
if led then
  local l = got[3]
  local seq = led.grant(l, lk[3], interval, now + wait, cost)
  led.save(l, lk, next_tat, now)
  return {'1', bind, sec, usec, stored, paused, 'g', string.format('%.17g', seq)}
end
return {'1', bind, sec, usec, stored, paused}

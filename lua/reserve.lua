
-- reserve: one transition over N dimensions, all or nothing (a single key is N = 1).
-- KEYS: per dimension, its state key K then its pause key (a Ledger lives in
--   K:l, K:h and K:b: ledger.lua; a partner's clamp in K:k: lib.lua).
-- ARGV[1]: now in ms ('' for the server's TIME); then per dimension 8 values:
--   kind, six parameters, cost; then optionally 'any': any dimension may
--   admit (algorithms.AnyWithin), and only those admitting commit.
-- Reply: {allowed '1'|'0', wait-or-retry ms, remaining, reset ms, binding, now,
--   then, when allowed, each dimension's new state[1] (its cancel tag), then
--   each dimension's sequence number in its key's Ledger ('0': none), then
--   with 'any' which dimensions committed ('1' or '0' each; a dimension
--   that did not has tag '0')}.
local now = clock(ARGV[1])
local n = #KEYS / 2
-- A key of the GCRA family may have a Ledger: read before anything is written.
local dims, not_before = read_dims(KEYS, ARGV, now, false, function(i, d)
  if d.alg ~= gcra then return nil end
  d.lk = {KEYS[2 * i - 1] .. ':l', KEYS[2 * i - 1] .. ':h', KEYS[2 * i - 1] .. ':b', KEYS[2 * i - 1] .. ':c'}
  local lraw, lwhy = get(d.lk[1])
  if lraw == nil then return refuse(i, 'ledger key ' .. lwhy) end
  if lraw then
    d.led = d.led or ledger_lib()
    d.l = d.led.decode(lraw)
    if not d.l then return refuse(i, 'ledger key holds a corrupt value') end
    local bad = d.led.check(d.lk)
    if bad then return refuse(i, bad) end
  end
  return nil
end)
if not dims then return not_before end
local any_mode = ARGV[2 + n * 8] == 'any'
local ok, wait, rem, reset, bind, took
if any_mode then
  ok, wait, rem, reset, bind, took = any_not_before(dims, now, not_before)
else
  ok, wait, rem, reset, bind = all_not_before(dims, now, not_before)
end
local ok_s = '0'
if ok then ok_s = '1' end
if ok and rem > 1 then -- a partner's clamp on a key it commits on: one request a slot
  for i = 1, n do
    if dims[i].clamp and (not took or took[i]) then
      rem = 1
      break
    end
  end
end
local reply = {ok_s, fmt(wait), fmt(rem), fmt(reset), tostring(bind), fmt(now)}
if ok then
  for i = 1, n do
    local d = dims[i]
    if took and not took[i] then
      reply[#reply + 1] = '0'
    else
      local _, cold_in = d.alg.status(d.p, d.st, now)
      local ttl = math.ceil(cold_in)
      if ttl < 1 then ttl = 1 end
      local enc
      if d.alg == gcra then enc = gcra_encode(d.p, d.st) else enc = encode(d.st) end
      redis.call('SET', KEYS[2 * i - 1], enc, 'PX', ttl)
      reply[#reply + 1] = fmt(d.st[1])
    end
  end
  for i = 1, n do -- a partner's clamp moves past the departure
    local d = dims[i]
    if d.clamp and (not took or took[i]) then advance_clamp(KEYS[2 * i - 1] .. ':k', d.clamp, now, now + wait) end
  end
  for i = 1, n do -- a key of the GCRA family with a Ledger records the departure
    local d, seq = dims[i], '0'
    if d.l and (not took or took[i]) then
      if d.led.fits(d.l, d.p[1], d.p[2]) then
        seq = fmt(d.led.grant(d.l, d.lk[3], d.p[1], now + wait, d.cost))
        d.led.save(d.l, d.lk, d.st[1], now)
      else -- made under another contract (changed live): dropped
        d.led.drop(d.lk)
      end
    end
    reply[#reply + 1] = seq
  end
  if took then -- which dimensions committed, as '0' and '1'
    local mask = {}
    for i = 1, n do
      if took[i] then mask[i] = '1' else mask[i] = '0' end
    end
    reply[#reply + 1] = table.concat(mask)
  end
end
return reply

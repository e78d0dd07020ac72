
-- settle: a reservation settled with its actual cost, or cancelled before its
-- slot, on each of its keys. For the GCRA family (kind 'g'): a key without a
-- Ledger gives back only the tail of its schedule (gcra.Kernel.SettleTail,
-- when its TAT is still the reservation's tag) and gets a Ledger; a key with
-- one follows its rule (ledger.lua). For the other algorithms an extra is
-- charged now (their commit of the difference); the sliding logs (kinds
-- 'l' and 'w') give back what a reservation did not use off the entry
-- stamped at its departure, the cost bucket (kind 'b') puts it back in the
-- bucket, and the others give nothing back.
-- KEYS: per key, its state key K (a Ledger lives in K:l, K:h, K:b, K:c).
-- ARGV: now in ms ('' for the server's TIME), the departure in ms, '1' when a
--   cancel may leave a hole (a shaper of one contract), then per key 11
--   values: kind, six parameters, tag, sequence number ('0': none; '-1': a slot of a contract changed since, whose extra is charged and nothing given back), cost,
--   actual ('-1': cancelled).
-- A cancel also gives back the next slot of a clamp in force (K:k) that
-- the cancelled slot was the last to move.
-- Reply: how many keys' states changed.
local now = clock(ARGV[1])
local at, holes_ok = tonumber(ARGV[2]), ARGV[3] == '1'
local led = ledger_lib()
local n = #KEYS
local work = {}
for i = 1, n do -- read and check everything before writing anything
  local a = 3 + (i - 1) * 11
  local p = {tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
             tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])}
  local w = {sk = KEYS[i], lk = {KEYS[i] .. ':l', KEYS[i] .. ':h', KEYS[i] .. ':b', KEYS[i] .. ':c'},
             kind = ARGV[a + 1], p = p, interval = p[1], tau = p[2],
             tag = tonumber(ARGV[a + 8]), seq = tonumber(ARGV[a + 9]), cost = tonumber(ARGV[a + 10]), actual = tonumber(ARGV[a + 11])}
  if not ALG[w.kind] then return redis.error_reply('throttlekit: unknown algorithm kind ' .. tostring(w.kind)) end
  local raw, why = get(w.sk)
  if raw == nil then return refuse(i, why) end
  if raw and w.kind ~= 'g' then
    w.st = decode(raw)
    if not w.st then return refuse(i, 'holds a corrupt state') end
    work[#work + 1] = w
  elseif w.kind ~= 'g' then -- no state: cold (expired); an extra is still charged, on the cold state
    if w.actual > w.cost then
      w.st = {}
      work[#work + 1] = w
    end
  else
    if raw then
      local st = decode(raw)
      if st then st = gcra_read(p, st, now) end
      if not st or #st ~= 1 then return refuse(i, 'holds a corrupt state') end
      w.s = st[1]
    end
    local lraw, lwhy = get(w.lk[1])
    if lraw == nil then return refuse(i, 'ledger key ' .. lwhy) end
    if lraw then
      w.l = led.decode(lraw)
      if not w.l then return refuse(i, 'ledger key holds a corrupt value') end
    end
    local bad = led.check(w.lk)
    if bad then return refuse(i, bad) end
    -- No state: the key went cold (expired) and nothing comes back; an
    -- extra is still charged (gcra.Kernel.ChargeCold).
    if raw or w.actual > w.cost then work[#work + 1] = w end
  end
end
local changed = 0
for _, w in ipairs(work) do
  if w.kind ~= 'g' then -- the other algorithms: the extra, committed now; a log gives back what its entry did not use
    local alg = ALG[w.kind]
    local st
    if w.actual > w.cost then
      st = alg.commit(w.p, w.st, now, 0, w.actual - w.cost)
    elseif alg.give_back then
      st = alg.give_back(w.p, w.st, now, at, w.cost - math.max(w.actual, 0))
    else
      st = w.st
    end
    local _, cold_in = alg.status(w.p, st, now)
    local ttl = math.ceil(cold_in)
    if ttl < 1 then ttl = 1 end
    redis.call('SET', w.sk, encode(st), 'PX', ttl)
    changed = changed + 1
  else
  local s, act = w.s, w.actual
  if act < 0 then act = 0 end
  if not s and w.l and led.fits(w.l, w.interval, w.tau) then -- cold, its Ledger still held: it tells a copy
    s = led.settle(w.l, w.lk, w.interval, w.tau, now, at, w.cost, act, w.seq, w.tag, now)
  elseif not s then -- cold (expired): every departure it held was at most now; the extra raises them
    s = now + (w.interval * act - w.interval * w.cost)
    w.l = led.new(s, now, w.interval, w.tau)
    if w.seq == 0 then led.claim_pre(w.lk[4], w.tag) end
  elseif w.seq < 0 or w.l and not led.fits(w.l, w.interval, w.tau) then -- a slot of another contract (seq -1), or another contract's Ledger: an extra is charged, nothing given back
    if act > w.cost then s = s + (w.interval * act - w.interval * w.cost) end
    if w.l and led.fits(w.l, w.interval, w.tau) then -- the key's own Ledger counts the extra all the same
      led.overran(w.l, w.lk, w.interval, w.tau, at, w.cost, act, s, now)
    end
  elseif not w.l and w.seq == 0 and s == w.tag then -- the tail: all of it comes back, and a Ledger begins
    s = gcra_settle_tail(w.interval, w.tau, s, at, w.cost, act)
    w.l = led.new(s, now, w.interval, w.tau)
    led.claim_pre(w.lk[4], w.tag)
    led.overran(w.l, w.lk, w.interval, w.tau, at, w.cost, act, s, now) -- counted in the holes the reservations before it may leave
  else
    if not w.l then w.l = led.new(s, now, w.interval, w.tau) end
    if w.actual < 0 and holes_ok then
      s = led.cancel(w.l, w.lk, w.interval, w.tau, s, at, w.cost, w.seq, w.tag, now)
    else
      s = led.settle(w.l, w.lk, w.interval, w.tau, s, at, w.cost, act, w.seq, w.tag, now)
    end
  end
  if s ~= w.s then
    local ttl = math.ceil(s - now)
    if ttl < 1 then ttl = 1 end
    redis.call('SET', w.sk, gcra_encode(w.p, {s}), 'PX', ttl)
    changed = changed + 1
  end
  if w.l then led.save(w.l, w.lk, s, now) end
  end
end
-- A cancelled slot that was the last a clamp in force scheduled gives the
-- clamp's next slot back too (a margin's, a partner's, a learned rate's),
-- as the key's schedule gave it back.
if ARGV[3 + 11] == '-1' then -- the first key's actual: a cancel
  for i = 1, n do
    local craw = get(KEYS[i] .. ':k')
    if craw then
      local c = parse_clamp(craw)
      if c and now < c[3] and c[1] == at + c[2] then
        local ttl = math.ceil(c[3] - now)
        if ttl < 1 then ttl = 1 end
        redis.call('SET', KEYS[i] .. ':k', fmt(at) .. ' ' .. fmt(c[2]) .. ' ' .. fmt(c[3]), 'PX', ttl)
      end
    end
  end
end
return changed

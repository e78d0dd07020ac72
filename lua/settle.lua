
-- settle: a reservation settled with its actual cost, or cancelled before its
-- slot, on each of its keys of the GCRA family (Reservation.Settle and
-- Cancel). A key without a Ledger gives back only the tail of its schedule
-- (gcra.Kernel.SettleTail, when its TAT is still the reservation's tag) and
-- gets a Ledger; a key with one follows its rule (ledger.lua).
-- KEYS: per key, its state key K (its Ledger lives in K:l, K:h, K:b, K:c).
-- ARGV: now in ms ('' for the server's TIME), the departure in ms, '1' when a
--   cancel may leave a hole (a shaper of one contract), then per key 6
--   values: tag, sequence number ('0': none), interval, tau, cost, actual
--   ('-1': cancelled).
-- Reply: how many keys' TATs changed.
local now = clock(ARGV[1])
local at, holes_ok = tonumber(ARGV[2]), ARGV[3] == '1'
local led = ledger_lib()
local n = #KEYS
local work = {}
for i = 1, n do -- read and check everything before writing anything
  local a = 3 + (i - 1) * 6
  local w = {sk = KEYS[i], lk = {KEYS[i] .. ':l', KEYS[i] .. ':h', KEYS[i] .. ':b', KEYS[i] .. ':c'},
             tag = tonumber(ARGV[a + 1]), seq = tonumber(ARGV[a + 2]), interval = tonumber(ARGV[a + 3]),
             tau = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]), actual = tonumber(ARGV[a + 6])}
  local raw, why = get(w.sk)
  if raw == nil then return refuse(i, why) end
  if raw then
    local st = decode(raw)
    if not st or #st ~= 1 then return refuse(i, 'holds a corrupt state') end
    w.s = st[1]
    local lraw, lwhy = get(w.lk[1])
    if lraw == nil then return refuse(i, 'ledger key ' .. lwhy) end
    if lraw then
      w.l = led.decode(lraw)
      if not w.l then return refuse(i, 'ledger key holds a corrupt value') end
    end
    work[#work + 1] = w
  end -- no state: cold (expired), nothing to give back
end
local changed = 0
for _, w in ipairs(work) do
  local s, act = w.s, w.actual
  if act < 0 then act = 0 end
  if not w.l and w.seq == 0 and s == w.tag then -- the tail: all of it comes back, and a Ledger begins
    local tc, ta = w.interval * w.cost, w.interval * act
    if act == 0 then
      s = s - tc
    else
      s = math.max(s - (tc - ta), at + math.min(ta, w.tau))
    end
    w.l = led.new(s, now, w.interval)
    led.claim_pre(w.lk[4], w.tag, now)
  else
    if not w.l then w.l = led.new(s, now, w.interval) end
    if w.actual < 0 and holes_ok then
      s = led.cancel(w.l, w.lk, w.interval, w.tau, s, at, w.cost, w.seq, w.tag, now)
    else
      s = led.settle(w.l, w.lk, w.interval, w.tau, s, at, w.cost, act, w.seq, w.tag, now)
    end
  end
  if s ~= w.s then
    local ttl = math.ceil(s - now)
    if ttl < 1 then ttl = 1 end
    redis.call('SET', w.sk, fmt(s), 'PX', ttl)
    changed = changed + 1
  end
  led.save(w.l, w.lk, s, now)
end
return changed

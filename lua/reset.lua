
-- reset_keys: redisstore's Reset of the state keys sks at now: their
-- schedules and Ledgers go, and their pauses (K:p) and partners' clamps
-- (K:k) unless keep (a learning key's Reset). A key of the GCRA family (kind 'g') whose reservations granted
-- before may still be cancelled or settled keeps the Ledger that gives
-- them nothing back (ledger.lua's reset: gcra.Kernel.ResetLedger), its TAT
-- gone (cold). A key whose state cannot be read is forgotten all the same.
-- argv[base + 7*(i-1) + 1 .. 7]: key i's kind and six parameters.
local function reset_keys(sks, argv, base, now, keep)
  local led = nil
  for i, k in ipairs(sks) do
    local a = base + 7 * (i - 1)
    local lk = {k .. ':l', k .. ':h', k .. ':b', k .. ':c'}
    local l, h = nil, nil
    if argv[a + 1] == 'g' then
      local p = {}
      for j = 1, 6 do p[j] = tonumber(argv[a + 1 + j]) end
      led = led or ledger_lib()
      local s = nil
      local raw = get(k)
      if raw then
        local st = gcra_read(p, decode(raw), now)
        if st then s = st[1] end
      end
      local old, horizon = nil, nil
      local lraw = get(lk[1])
      if lraw then old = led.decode(lraw) end
      if old and not led.check(lk) then
        for _, z in ipairs({lk[2], lk[4]}) do -- the last hole, the last claimed tag (Ledger.Horizon)
          local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
          if last[2] and (not horizon or tonumber(last[2]) > horizon) then horizon = tonumber(last[2]) end
        end
      end
      l, h = led.reset(old, s, horizon, now, p[1], p[2])
    end
    redis.call('DEL', k, lk[1], lk[2], lk[3], lk[4])
    if not keep then redis.call('DEL', k .. ':p', k .. ':k') end
    if l then
      led.claim_pre(lk[4], h)
      led.save(l, lk, now, now)
    end
  end
end

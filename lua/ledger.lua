-- ledger: internal/gcra's Ledger (ledger.go), operation for operation: what a
-- key of the GCRA family keeps once a reservation on it was settled or
-- cancelled, so that what it did not use goes back without breaking the
-- contract. ledger_lib() builds its functions only when a script needs them
-- (a key without a Ledger pays for one closure). A key K's Ledger lives in
-- K:l ("start seq n at1 q1 ... atn qn interval tau [m at1 x1 seq1 until1 ...
-- atm xm seqm untilm]": the staircase, the contract, the overruns it
-- remembers), its holes in the sorted
-- set K:h (score: the instant; member: "at cap"), its settled flags in the
-- bitmap K:b, and the tags of reservations granted before it that were given
-- back, until they pass, in the sorted set K:c.
local function ledger_lib()
  local W, UNBOUNDED, MAX_MARKS, MAX_LOOK, MAX_PRE, MAX_OVER = 4096, 1e300, 8, 64, 64, 8
  local L = {}
  local function num(x) return string.format('%.17g', x) end

  function L.decode(raw)
    local v = {}
    for w in string.gmatch(raw, '%S+') do
      local x = tonumber(w)
      if not x or x ~= x or x == math.huge or x == -math.huge then return nil end
      v[#v + 1] = x
    end
    if #v < 3 or v[3] < 0 or v[3] % 1 ~= 0 then return nil end
    local n = 3 + 2 * v[3]
    local m = 0 -- overruns
    if #v > n + 2 then
      m = v[n + 3]
      if not m or m < 0 or m % 1 ~= 0 or #v ~= n + 3 + 4 * m then return nil end
    elseif #v ~= n and #v ~= n + 2 then
      return nil
    end
    local l = {start = v[1], seq = v[2], marks = {}, over = {}}
    for i = 1, v[3] do l.marks[i] = {v[2 + 2 * i], v[3 + 2 * i]} end
    if #v >= n + 2 then l.interval, l.tau = v[n + 1], v[n + 2] end -- written before them: no parameters
    for i = 1, m do
      local a = n + 3 + 4 * (i - 1)
      l.over[i] = {v[a + 1], v[a + 2], v[a + 3], v[a + 4]}
    end
    return l
  end

  function L.encode(l)
    local out = {num(l.start), num(l.seq), tostring(#l.marks)}
    for _, m in ipairs(l.marks) do
      out[#out + 1] = num(m[1])
      out[#out + 1] = num(m[2])
    end
    if l.interval then
      out[#out + 1] = num(l.interval)
      out[#out + 1] = num(l.tau)
      if #l.over > 0 then
        out[#out + 1] = tostring(#l.over)
        for _, o in ipairs(l.over) do
          for j = 1, 4 do out[#out + 1] = num(o[j]) end
        end
      end
    end
    return table.concat(out, ' ')
  end

  -- new: gcra.Kernel.NewLedger.
  function L.new(s, now, interval, tau)
    local start = math.floor(now * 1000)
    local l = {interval = interval, tau = tau, start = start, seq = start, marks = {}, over = {}}
    if s and s > now then l.marks[1] = {s, UNBOUNDED} end
    return l
  end

  -- reset: gcra.Kernel.ResetLedger, for a key whose TAT is s (nil: cold)
  -- and whose old Ledger (nil: none) reaches horizon (its last hole or
  -- claimed tag; nil: none); the Ledger and the tag to claim, or nil.
  function L.reset(old, s, horizon, now, interval, tau)
    local h = s or -math.huge
    if old and horizon and horizon > h then h = horizon end
    if not (h > now) then return nil end
    local l = L.new(h, now, interval, tau)
    if old and old.seq > l.start then l.start, l.seq = old.seq, old.seq end
    l.over[1] = {now, tau, l.start, h}
    return l, h
  end

  -- renew: gcra.Kernel.RenewLedger (old: the Ledger gone idle).
  function L.renew(old, s, now, interval, tau)
    local l = L.new(s, now, interval, tau)
    if old.seq > l.start then l.start, l.seq = old.seq, old.seq end
    return l
  end

  -- fits: Ledger.Fits (a Ledger written before it recorded its parameters
  -- is taken to fit, as it was used then).
  function L.fits(l, interval, tau)
    return l.interval == nil or (l.interval == interval and l.tau == tau)
  end

  -- check returns nil when the Ledger's other keys (K:h, K:b, K:c) hold
  -- nothing or their own types, else why not: a script checks it before it
  -- writes anything, so that a key it refuses is left as it was.
  function L.check(keys)
    local want = {'zset', 'string', 'zset'}
    for i = 2, 4 do
      local t = redis.call('TYPE', keys[i])
      if type(t) == 'table' then t = t.ok end
      if t ~= 'none' and t ~= want[i - 1] then return 'ledger key ' .. string.sub(keys[i], -2) .. ' holds a value of another type' end
    end
    return nil
  end

  -- drop deletes a Ledger that does not fit (keys: K:l, K:h, K:b, K:c).
  function L.drop(keys)
    redis.call('DEL', keys[1], keys[2], keys[3], keys[4])
  end

  local function q(l, t) -- the bound after t
    local r = -math.huge
    for _, m in ipairs(l.marks) do
      if m[1] > t and m[2] > r then r = m[2] end
    end
    return r
  end

  local function q_from(l, t) -- the bound at or after t
    local r = -math.huge
    for _, m in ipairs(l.marks) do
      if m[1] >= t and m[2] > r then r = m[2] end
    end
    return r
  end

  local function grow(l, t, x)
    for _, m in ipairs(l.marks) do
      m[2] = m[2] + x
      if m[1] >= t then return end
    end
  end

  local function mark(l, t, qv)
    local ms = l.marks
    local i = 1
    while i <= #ms and ms[i][1] < t do i = i + 1 end
    if i <= #ms and ms[i][1] == t then
      if qv > ms[i][2] then ms[i][2] = qv end
    else
      table.insert(ms, i, {t, qv})
    end
    local out = {}
    for j = 1, #ms do
      local dominated = false
      for k = j + 1, #ms do
        if ms[k][2] >= ms[j][2] then dominated = true break end
      end
      if not dominated then out[#out + 1] = ms[j] end
    end
    while #out > MAX_MARKS do -- the closest neighbours become one step
      local i = 1
      for j = 2, #out - 1 do
        if out[j][2] - out[j + 1][2] < out[i][2] - out[i + 1][2] then i = j end
      end
      out[i + 1][2] = out[i][2]
      table.remove(out, i)
    end
    l.marks = out
  end

  local function next_seq(l, bits)
    l.seq = l.seq + 1
    redis.call('SETBIT', bits, l.seq % W, 0)
    return l.seq
  end

  -- claim_pre: Ledger.claimPre, on the sorted set pre (at most MAX_PRE
  -- claims, the oldest forgotten first).
  local function claim_pre(pre, tag)
    if redis.call('ZADD', pre, 'NX', num(tag), num(tag)) ~= 1 then return false end
    redis.call('ZREMRANGEBYRANK', pre, 0, -(MAX_PRE + 1))
    return true
  end
  L.claim_pre = claim_pre

  -- claim: Ledger.claim: 'claimed', 'already' or 'unknown'.
  local function claim(l, bits, seq)
    if not (seq > l.start and seq <= l.seq and l.seq - seq < W) then return 'unknown' end
    if redis.call('SETBIT', bits, seq % W, 1) == 0 then return 'claimed' end
    return 'already'
  end

  -- grant: Ledger.Grant.
  function L.grant(l, bits, interval, t, cost)
    local tc = interval * cost
    local base = q_from(l, t)
    if t > base then base = t end
    local term = base + tc
    grow(l, t, tc)
    mark(l, t, term)
    return next_seq(l, bits)
  end

  local function room(l, s, t, d) -- min(d, s - Q(t)), never below 0
    local r = s - q(l, t)
    if d < r then r = d end
    if r < 0 then r = 0 end
    return r
  end

  local function lower(l, t, x)
    for _, m in ipairs(l.marks) do
      if m[1] <= t then m[2] = m[2] - x end
    end
  end

  -- charge: Ledger.charge: an extra x charged at t, the key's TAT s after
  -- it, at now: the terms that include t grow; every hole at or after t
  -- loses x (one left below a unit goes; a member that is not a hole is
  -- left for take to report); the overrun is remembered (the oldest two
  -- merged past MAX_OVER, those already past forgotten).
  local function charge(l, holes, interval, tau, t, x, s, now)
    grow(l, t, x)
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', holes, num(t), '+inf')) do
      local at_s, cap_s = string.match(member, '^(%S+) (%S+)$')
      local cap = tonumber(cap_s)
      if at_s and cap and cap == cap then
        redis.call('ZREM', holes, member)
        cap = cap - x
        if cap >= interval then redis.call('ZADD', holes, at_s, at_s .. ' ' .. num(cap)) end
      end
    end
    local kept = {}
    for _, o in ipairs(l.over) do
      if o[4] >= now then kept[#kept + 1] = o end
    end
    kept[#kept + 1] = {t, x, l.seq, s}
    if #kept > MAX_OVER then
      local a, b = kept[1], kept[2]
      kept[2] = {math.min(a[1], b[1]), a[2] + b[2], math.max(a[3], b[3]), math.max(a[4], b[4])}
      table.remove(kept, 1)
    end
    l.over = kept
    if not l.interval then l.interval, l.tau = interval, tau end -- a Ledger written before them: it is this contract's
  end

  -- overran: Ledger.Overran (keys: K:l, K:h, K:b, K:c).
  function L.overran(l, keys, interval, tau, t, cost, actual, s, now)
    local tc, ta = interval * cost, interval * actual
    if ta > tc then charge(l, keys[2], interval, tau, t, ta - tc, s, now) end
  end

  -- debt: Ledger.debt: what the overruns settled after the grant seq (0:
  -- before the Ledger), at or before t, add at t.
  local function debt(l, t, seq)
    local d = 0
    for _, o in ipairs(l.over) do
      if o[1] <= t and seq <= o[3] then d = d + o[2] end
    end
    return d
  end

  -- settle: Ledger.Settle; returns the TAT to store. keys: K:l, K:h, K:b, K:c.
  function L.settle(l, keys, interval, tau, s, t, cost, actual, seq, tag, now)
    local known = true
    if seq == 0 then
      if not claim_pre(keys[4], tag) then return s end
    else
      local c = claim(l, keys[3], seq)
      if c == 'already' then return s end
      known = c == 'claimed'
    end
    local tc, ta = interval * cost, interval * actual
    if ta > tc then
      charge(l, keys[2], interval, tau, t, ta - tc, s + (ta - tc), now)
      return s + (ta - tc)
    end
    if seq == 0 or not known or ta == tc then return s end
    local own = math.min(tc, tau) - math.min(ta, tau)
    local refund = room(l, s, t, tc - ta)
    if own < refund then refund = own end
    lower(l, t, tc - ta)
    return s - refund
  end

  local function add_hole(holes, t, c)
    local got = redis.call('ZRANGEBYSCORE', holes, num(t), num(t))
    if got[1] then
      local cap = tonumber(string.match(got[1], ' (%S+)$'))
      redis.call('ZREM', holes, got[1])
      c = cap + c
    end
    redis.call('ZADD', holes, num(t), num(t) .. ' ' .. num(c))
  end

  -- cancel: Ledger.Cancel; returns the TAT to store. keys: K:l, K:h, K:b, K:c.
  function L.cancel(l, keys, interval, tau, s, t, cost, seq, tag, now)
    if seq == 0 and (tag < now or not claim_pre(keys[4], tag)) or seq ~= 0 and claim(l, keys[3], seq) ~= 'claimed' then return s end
    local holes = keys[2]
    local tc = interval * cost
    local refund = room(l, s, t, tc)
    lower(l, t, refund)
    local rest = math.min(tc, tau) - refund - debt(l, t, seq)
    if rest > 0 then add_hole(holes, t, rest) end
    return s - refund
  end

  -- take: Ledger.Take; returns the hole's instant and the sequence number,
  -- or nil (and why, for a hole that is not one: nothing else is written).
  function L.take(l, bits, holes, interval, max_wait, now, floor, before, cost)
    redis.call('ZREMRANGEBYSCORE', holes, '-inf', '(' .. num(now))
    local hi = '+inf'
    if before ~= math.huge then hi = '(' .. num(before) end
    local got = redis.call('ZRANGEBYSCORE', holes, num(now), hi, 'LIMIT', 0, MAX_LOOK)
    local tc = interval * cost
    for _, member in ipairs(got) do
      local at_s, cap_s = string.match(member, '^(%S+) (%S+)$')
      local at, cap = tonumber(at_s), tonumber(cap_s)
      if not at or not cap or at ~= at or cap ~= cap then return nil, nil, 'ledger hole holds a corrupt value' end
      if at - now > max_wait then return nil end
      if at >= floor and cap >= tc then
        redis.call('ZREM', holes, member)
        cap = cap - tc
        if cap >= interval then redis.call('ZADD', holes, at_s, at_s .. ' ' .. num(cap)) end
        return at, next_seq(l, bits)
      end
    end
    return nil
  end

  -- idle: Ledger.Idle (after take dropped the holes already past).
  function L.idle(keys, s, now)
    return s <= now and not redis.call('ZRANGEBYSCORE', keys[2], num(now), '+inf', 'LIMIT', 0, 1)[1]
      and not redis.call('ZRANGEBYSCORE', keys[4], num(now), '+inf', 'LIMIT', 0, 1)[1]
  end

  -- save writes the Ledger and gives its keys the time to live of a key
  -- whose TAT is s: until s, its last hole and its last claimed tag have
  -- passed.
  function L.save(l, keys, s, now)
    local horizon = s
    for _, z in ipairs({keys[2], keys[4]}) do -- the last hole, the last claimed tag
      local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
      if last[2] and tonumber(last[2]) > horizon then horizon = tonumber(last[2]) end
    end
    local ttl = math.ceil(horizon - now)
    if ttl < 1 then ttl = 1 end
    redis.call('SET', keys[1], L.encode(l), 'PX', ttl)
    redis.call('PEXPIRE', keys[2], ttl)
    redis.call('PEXPIRE', keys[3], ttl)
    redis.call('PEXPIRE', keys[4], ttl)
  end

  return L
end

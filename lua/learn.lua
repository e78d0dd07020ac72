
-- learn: what the shapers of a fleet learned of one partner key (package
-- internal/learn's State, encoded; its first field is its version), the
-- fleet's tallies of the partner's answers, and the clamp its rate sets on
-- the key's departures.
-- KEYS[1]: the record; KEYS[2]: the tallies, a hash of "a<bucket>"
--   (accepted) and "n<bucket>" (answered) counts; KEYS[3..]: the state keys
--   the clamp holds.
-- ARGV[1]: the version the caller read ('0': none); ARGV[2]: the record to
--   write ('' writes none); ARGV[3]: its life in ms; ARGV[4]: the clamp's
--   now in ms ('' for TIME, '-' sets no clamp); ARGV[5]: the clamp's
--   interval; ARGV[6]: its span in ms; ARGV[7]: '1' to leave a key whose
--   clamp in force spaces departures further apart; ARGV[8]: the
--   oldest bucket kept (older ones are dropped); ARGV[9]: the first bucket
--   to read ('0': none); ARGV[10]: the tallies' life in ms; ARGV[11]: '1'
--   to reset the state keys first (reset: their schedules and ledgers go,
--   their pauses and clamps stay; with a clamp only); ARGV[12]: how many
--   tallies to add, then per tally its bucket, accepted and answered; with
--   ARGV[11] '1', per state key its kind and six parameters (reset.lua).
-- The tallies are added whatever the version; when the record's version
-- is ARGV[1] the record, the reset and the clamp are written, otherwise
-- none is.
-- Reply: {the record in force after the call ('' for none), {bucket,
--   accepted, answered, ...} of the buckets from ARGV[9], in bucket order}.
local cur, why = get(KEYS[1])
if cur == nil then return redis.error_reply('TKSTATE learned record ' .. why) end
cur = cur or ''
local nadd = tonumber(ARGV[12])
local tallies = {}
if nadd > 0 or ARGV[9] ~= '0' then
  local ty = redis.call('TYPE', KEYS[2])['ok']
  if ty ~= 'none' and ty ~= 'hash' then return redis.error_reply('TKSTATE learned tallies hold a value of another type') end
  for i = 0, nadd - 1 do
    local a = 13 + i * 3
    redis.call('HINCRBY', KEYS[2], 'a' .. ARGV[a], ARGV[a + 1])
    redis.call('HINCRBY', KEYS[2], 'n' .. ARGV[a], ARGV[a + 2])
  end
  if nadd > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[10]) end
  local oldest, from = tonumber(ARGV[8]), tonumber(ARGV[9])
  local all = redis.call('HGETALL', KEYS[2])
  local acc, ans, seen, old = {}, {}, {}, {}
  for i = 1, #all, 2 do
    local kind, b = string.sub(all[i], 1, 1), tonumber(string.sub(all[i], 2))
    if b == nil then
      old[#old + 1] = all[i]
    elseif b < oldest then
      old[#old + 1] = all[i]
    else
      if kind == 'a' then acc[b] = tonumber(all[i + 1]) else ans[b] = tonumber(all[i + 1]) end
      if not seen[b] then seen[b] = true end
    end
  end
  if #old > 0 then redis.call('HDEL', KEYS[2], unpack(old)) end
  if from > 0 then
    local bs = {}
    for b in pairs(seen) do if b >= from then bs[#bs + 1] = b end end
    table.sort(bs)
    for _, b in ipairs(bs) do
      tallies[#tallies + 1] = b
      tallies[#tallies + 1] = acc[b] or 0
      tallies[#tallies + 1] = ans[b] or 0
    end
  end
end
-- As learn.Version: the first field, a decimal number without a leading
-- zero that fits 64 bits (same length: compared as strings), else none.
local ver = string.match(cur, '^([^ ]*)') or ''
if not string.match(ver, '^[1-9]%d*$') or #ver > 20 or (#ver == 20 and ver > '18446744073709551615') then ver = '0' end
if ver ~= ARGV[1] then return {cur, tallies} end
if ARGV[4] ~= '-' then
  local r = set_clamp(3, clock(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1')
  if type(r) == 'table' and r.err then return r end
  if ARGV[11] == '1' then -- redisstore's Reset but the pause and the clamp (K:p, K:k)
    local sks = {}
    for i = 3, #KEYS do sks[#sks + 1] = KEYS[i] end
    reset_keys(sks, ARGV, 12 + 3 * nadd, clock(ARGV[4]), true)
  end
end
if ARGV[2] ~= '' then
  local ttl = math.ceil(tonumber(ARGV[3]))
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  cur = ARGV[2]
end
return {cur, tallies}

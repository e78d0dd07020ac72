
-- learn: what the shapers of a fleet learned of one partner key (package
-- internal/learn's State, encoded; its first field is its version), and
-- the clamp its rate sets on the key's departures.
-- KEYS[1]: the record; KEYS[2..]: the state keys the clamp holds.
-- ARGV[1]: the version the caller read ('0': none); ARGV[2]: the record to
--   write ('' writes none); ARGV[3]: its life in ms; ARGV[4]: the clamp's
--   now in ms ('' for TIME, '-' sets no clamp); ARGV[5]: the clamp's
--   interval; ARGV[6]: its span in ms; ARGV[7]: '1' to leave a key whose
--   clamp in force spaces departures at least as far apart.
-- When the record's version is ARGV[1] the record and the clamp are
-- written; otherwise nothing is.
-- Reply: the record in force after the call ('' for none).
local cur, why = get(KEYS[1])
if cur == nil then return redis.error_reply('TKSTATE learned record ' .. why) end
cur = cur or ''
local ver = string.match(cur, '^(%d+)') or '0'
if ver ~= ARGV[1] then return cur end
if ARGV[4] ~= '-' then
  local r = set_clamp(2, clock(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1')
  if type(r) == 'table' and r.err then return r end
end
if ARGV[2] ~= '' then
  local ttl = math.ceil(tonumber(ARGV[3]))
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  cur = ARGV[2]
end
return cur

-- reserve_batch: many reservations in one call, decided one after another
-- exactly as that many calls of reserve_gcra.lua or reserve.lua in that order
-- would decide them (their bodies run unchanged, as the functions
-- reserve_gcra and reserve_dims defined before this file). A reservation
-- that fails (a key of another type, a corrupt state, a refused cost) gets
-- its error as its reply and nothing else changes: the others are decided as
-- if it had not been made.
-- KEYS: the reservations' keys, one after another.
-- ARGV[1]: how many reservations; then per reservation its script ('g':
--   reserve_gcra.lua, 'r': reserve.lua), how many keys and how many
--   arguments it takes, then those arguments.
-- Reply: per reservation, its script's reply or its error; then the ms the
--   batch took from its TIME to its last reservation's end.
local n = tonumber(ARGV[1])
-- One instant for all: the server's TIME read once (lib.lua's batch_time),
-- as if every call of the batch had come at once.
batch_time = redis.call('TIME')
local out = {}

-- A run of reserve_gcra reservations on one key with neither a Ledger nor a
-- clamp (most batches on a hot key) reads the key once and writes it once:
-- between them each reservation reads the TAT the one before it wrote, as
-- its MGET would have, and its SET is held until the run ends, when the
-- last TAT and TTL are written, as the last SET would have left them. Only
-- a key some SET of the run already wrote (so it holds a string) is held.
local hot = nil -- {key, stored, paused, clean, written, value, ttl, held}
local current = 0 -- the reservation running
local function flush()
  if hot and hot.value then
    local r = redis.pcall('SET', hot.key, hot.value, 'PX', hot.ttl)
    if type(r) == 'table' and r.err then -- nothing was written for them: they fail
      for _, i in ipairs(hot.held) do out[i] = redis.error_reply(r.err) end
    end
  end
  hot = nil
end
read_keys = function(k, p, l, c)
  if hot and hot.key == k and hot.clean then
    return {hot.stored, hot.paused, false, false}
  end
  flush()
  local got = redis.call('MGET', k, p, l, c)
  hot = {key = k, stored = got[1], paused = got[2], clean = not got[3] and not got[4], held = {}}
  return got
end
write_tat = function(k, v, ttl)
  if hot and hot.key == k and hot.clean and hot.written then
    local old = hot.stored
    hot.stored, hot.value, hot.ttl = v, v, ttl
    hot.held[#hot.held + 1] = current
    return old
  end
  local r = redis.pcall('SET', k, v, 'PX', ttl, 'GET')
  if hot and hot.key == k and not (type(r) == 'table' and r.err) then
    hot.written, hot.stored = true, v
  end
  return r
end

local ki, ai = 1, 2
for m = 1, n do
  local kind, nk, na = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  ai = ai + 3
  local keys, argv = {}, {}
  for j = 1, nk do keys[j] = KEYS[ki + j - 1] end
  for j = 1, na do argv[j] = ARGV[ai + j - 1] end
  ki, ai = ki + nk, ai + na
  local run = reserve_gcra
  if kind == 'r' then
    run = reserve_dims
    flush() -- it reads the keys itself
  end
  current = m
  local ok, rep = pcall(run, keys, argv)
  if not ok then -- a raised error (redis.call's is a table with err)
    if type(rep) == 'table' and rep.err then
      rep = redis.error_reply(rep.err)
    else
      rep = redis.error_reply('ERR ' .. tostring(rep))
    end
  end
  out[m] = rep
end
flush()
-- Last, how long the batch took (ms on the server's clock): each
-- reservation's delay counts from the reply, so the caller takes off the
-- time the server spent after the batch's TIME.
local t = redis.call('TIME')
out[n + 1] = string.format('%.17g', (tonumber(t[1]) - tonumber(batch_time[1])) * 1000 + (tonumber(t[2]) - tonumber(batch_time[2])) / 1000)
return out

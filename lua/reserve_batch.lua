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
-- Reply: per reservation, its script's reply or its error.
local n = tonumber(ARGV[1])
-- One instant for all: the server's TIME read once (lib.lua's batch_time),
-- as if every call of the batch had come at once.
batch_time = redis.call('TIME')
local out = {}
local ki, ai = 1, 2
for m = 1, n do
  local kind, nk, na = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  ai = ai + 3
  local keys, argv = {}, {}
  for j = 1, nk do keys[j] = KEYS[ki + j - 1] end
  for j = 1, na do argv[j] = ARGV[ai + j - 1] end
  ki, ai = ki + nk, ai + na
  local run = reserve_gcra
  if kind == 'r' then run = reserve_dims end
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
return out

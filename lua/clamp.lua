
-- clamp: a partner's count of the calls left on these keys until its reset:
-- until now + span, nothing departs on a key less than interval after the
-- previous departure reserved under the clamp (lib.lua's parse_clamp). A
-- clamp replaces the one before it, whose next slot, if it has not come,
-- stays held (or its reset, whichever is sooner), but no later than the
-- new interval after the departure before it (set_clamp's spread).
-- With ARGV[4] '1' (a pause's resumed pace) the clamp merges with the one
-- in force: the one spacing departures further apart holds, until the
-- later of the two ends (set_clamp's tighter: a pace never loosens a
-- partner's count, and a shorter pause never shortens a longer one's pace).
-- KEYS: the state keys (a clamp lives in K:k). ARGV[1]: now in ms ('' for
--   TIME); ARGV[2]: the interval in ms; ARGV[3]: the span in ms; ARGV[4]:
--   '1' to keep a tighter clamp (absent: '0').
-- Reply: the clamp's end (ms) as a string.
return set_clamp(1, clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1', true)

-- Forget one record when the rule allows its state: decided and deleted in
-- one script, so a record renewed or completed meanwhile is never deleted
-- on the strength of a state it no longer has.
--
-- KEYS[1]: the record's hash.
-- ARGV[1]: '1' when a completed record may be deleted.
-- ARGV[2]: '1' when an abandoned record (in flight, lease lapsed) may be.
-- ARGV[3]: the events channel, told of a deletion.
--
-- Returns {0, ''} when there is no record, {1, state} when it was deleted,
-- {2, state} when it was kept; state is 'c' (completed), 'a' (abandoned)
-- or 'f' (in flight, live lease: always kept).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('HMGET', KEYS[1], 's', 'l')
if not held[1] then return {0, ''} end
local state
if held[1] == 'c' then
  state = 'c'
elseif tonumber(held[2]) <= now then
  state = 'a'
else
  state = 'f'
end
if (state == 'c' and ARGV[1] == '1') or (state == 'a' and ARGV[2] == '1') then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], KEYS[1])
  return {1, state}
end
return {2, state}

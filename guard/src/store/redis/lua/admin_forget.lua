-- Forget one record when the rule allows its state (after legacy.lua):
-- decided and deleted in one script, so a record renewed or completed
-- meanwhile is never deleted on the strength of a state it no longer has.
--
-- KEYS[1]: the record's key (a version 2 value, or a hash of release 1).
-- ARGV[1]: '1' when a completed record may be deleted.
-- ARGV[2]: '1' when an abandoned record (in flight, lease lapsed) may be.
-- ARGV[3]: the events channel, told of a deletion.
--
-- Returns {0, ''} when there is no record, {1, state} when it was deleted,
-- {2, state} when it was kept; state is 'c' (completed), 'a' (abandoned)
-- or 'f' (in flight, live lease: always kept).
local kind = redis.call('TYPE', KEYS[1]).ok
local state
if kind == 'string' then
  local v = redis.call('GET', KEYS[1])
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then left = 0 end
  if string.sub(v, STATE, STATE) == COMPLETED then
    state = 'c'
  elseif struct.unpack('>I8', v, LEASE_END) <= struct.unpack('>I8', v, RETENTION) - left then
    state = 'a'
  else
    state = 'f'
  end
elseif kind == 'hash' then
  local held = redis.call('HMGET', KEYS[1], 's', 'l')
  if held[1] == 'c' then
    state = 'c'
  elseif tonumber(held[2]) <= legacy_now() then
    state = 'a'
  else
    state = 'f'
  end
else
  return {0, ''}
end
if (state == 'c' and ARGV[1] == '1') or (state == 'a' and ARGV[2] == '1') then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], KEYS[1])
  return {1, state}
end
return {2, state}

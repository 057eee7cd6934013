-- Get (after legacy_pack.lua and legacy.lua): the record and the time its
-- key has left, in one round trip: {0} none, {2, PTTL, value} a version 2
-- record, {1, clock, packed fields} a record of release 1. A reader of an
-- in-flight record may be about to wait for its end: mark it watched, so
-- that its end is published (complete.lua, release.lua and renew.lua
-- publish only for watched records).
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then return legacy_read(KEYS[1]) end
  return redis.error_reply(v.err)
end
if not v then return {0} end
if string.sub(v, 1, WATCHED) == MARK .. IN_FLIGHT .. '0' then
  redis.call('SETRANGE', KEYS[1], WATCHED - 1, '1')
end
return {2, redis.call('PTTL', KEYS[1]), v}

-- Get: the record's fields and the clock, in one round trip. A reader of an
-- in-flight record may be about to wait for its end: mark the record
-- watched (`w`), so that its end is published (complete.lua, release.lua,
-- renew.lua publish only for watched records).
local fields = redis.call('HMGET', KEYS[1], 't', 's', 'l', 'e', 'n', 'm', 'p', 'c')
if fields[2] == 'f' then redis.call('HSET', KEYS[1], 'w', '1') end
return {now, fields}

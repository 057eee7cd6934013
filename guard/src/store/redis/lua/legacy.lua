-- Release 1's records: one hash per record (fields t token, s state f/c,
-- l lease end, e expiry, n creation, as Unix ms on the server's clock, m
-- the packed request, p the packed response, c completion, w watched).
-- `legacy_read(key)` answers their fields packed (legacy_pack.lua) with
-- the server's clock, and marks an in-flight one watched, as release 1's
-- get.lua did; `legacy_now()` is the server's clock in ms.
local function legacy_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function legacy_read(key)
  local fields = redis.call('HMGET', key, 't', 's', 'l', 'e', 'n', 'm', 'p', 'c')
  if fields[2] == 'f' then redis.call('HSET', key, 'w', '1') end
  return {1, legacy_now(), pack(fields)}
end

-- Writes a fresh in-flight record: t token, s state (f in flight),
-- l lease end, e expiry, n creation, m the packed request.
local function write_new(token, lease, retention, request)
  local expires = now + tonumber(retention)
  redis.call('HSET', KEYS[1], 't', token, 's', 'f', 'l', now + tonumber(lease), 'e', expires, 'n', now, 'm', request)
  redis.call('PEXPIREAT', KEYS[1], expires)
end

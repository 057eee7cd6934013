-- Writes a fresh in-flight record at `key`: t token, s state (f in
-- flight), l lease end, e expiry, n creation, m the packed request.
local function write_new(key, token, lease, retention, request)
  local expires = now + tonumber(retention)
  redis.call('HSET', key, 't', token, 's', 'f', 'l', now + tonumber(lease), 'e', expires, 'n', now, 'm', request)
  redis.call('PEXPIREAT', key, expires)
end

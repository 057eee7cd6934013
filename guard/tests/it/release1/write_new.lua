-- Writes a fresh in-flight record at `key`: t token, s state (f in
-- flight), l lease end, e expiry, n creation, m the packed request.
local function write_new(key, token, lease, retention, request)
  local expires = string.format('%d', now + tonumber(retention))
  local lease_end = string.format('%d', now + tonumber(lease))
  redis.call('HSET', key, 't', token, 's', 'f', 'l', lease_end, 'e', expires, 'n', now_text, 'm', request)
  redis.call('PEXPIREAT', key, expires)
end

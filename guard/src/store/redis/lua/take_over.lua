-- Take over (after legacy.lua) the record holding token ARGV[1] if its
-- lease ended (or, for a record of release 1, its retention): replace it
-- with the in-flight value ARGV[2], expiring ARGV[3] ms from now. A
-- version 2 record expires natively, so one that exists is within its
-- retention.
-- The steps and stored request of a version 2 record are kept (a resumed
-- run gets them back).
local kind = redis.call('TYPE', KEYS[1]).ok
local steps, stored = '', ''
if kind == 'string' then
  local v = redis.call('GET', KEYS[1])
  if string.sub(v, 1, STATE) ~= MARK .. IN_FLIGHT
      or string.sub(v, TOKEN, TOKEN_END) ~= ARGV[1] then
    return 0
  end
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then left = 0 end
  if struct.unpack('>I8', v, LEASE_END) > struct.unpack('>I8', v, RETENTION) - left then
    return 0
  end
  local _
  _, steps, stored = split_steps(v)
elseif kind == 'hash' then
  local old = redis.call('HMGET', KEYS[1], 't', 's', 'l', 'e')
  local now = legacy_now()
  if old[1] ~= ARGV[1] then return 0 end
  if not (tonumber(old[4]) <= now or (old[2] == 'f' and tonumber(old[3]) <= now)) then
    return 0
  end
else
  return 0
end
local new = ARGV[2]
if steps ~= '' or stored ~= '' then
  local request = with_steps(string.sub(new, HEADER + 1), steps, stored)
  new = string.sub(new, 1, REQUEST_LEN - 1) .. struct.pack('>I4', #request) .. request
end
redis.call('SET', KEYS[1], new, 'PX', ARGV[3])
return 1

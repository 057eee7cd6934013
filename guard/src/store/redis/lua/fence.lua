-- The fence every write of a lease holder starts with: KEYS[1] holds a
-- version 2 record in flight under token ARGV[1] (the layout's positions
-- come first, from codec.rs). `watched` tells whether a reader may wait
-- for its end (see get.lua); `since_claim()` is the time since the claim
-- on the server's clock: the retention less what the key has left.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, STATE) ~= MARK .. IN_FLIGHT
    or string.sub(v, TOKEN, TOKEN_END) ~= ARGV[1] then
  return 0
end
local watched = string.sub(v, WATCHED, WATCHED) == '1'
local function since_claim()
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then left = 0 end
  return struct.unpack('>I8', v, RETENTION) - left
end

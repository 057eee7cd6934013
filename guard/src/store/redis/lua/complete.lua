-- Complete (after fence.lua): the record becomes completed with the packed
-- response ARGV[2], keeping its expiry; publish on ARGV[3] if a reader
-- marked it watched.
local request_end = HEADER + struct.unpack('>I4', v, REQUEST_LEN)
redis.call('SET', KEYS[1],
  MARK .. COMPLETED .. '0' .. string.sub(v, TOKEN, COMPLETION - 1)
    .. struct.pack('>I8', since_claim()) .. string.sub(v, REQUEST_LEN, request_end) .. ARGV[2],
  'KEEPTTL')
if watched then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1

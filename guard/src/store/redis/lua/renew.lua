-- Renew (after fence.lua) the lease to ARGV[2] ms from now, unless it has
-- already ended (a renewal on its way at the cut-off must not revive an
-- abandoned record); a zero renewal ends it and is published on ARGV[3]
-- if a reader marked the record watched.
local now = since_claim()
if struct.unpack('>I8', v, LEASE_END) <= now then return 0 end
redis.call('SETRANGE', KEYS[1], LEASE_END - 1, struct.pack('>I8', now + tonumber(ARGV[2])))
if ARGV[2] == '0' and watched then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1

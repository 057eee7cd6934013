-- Renew the lease to ARGV[2] ms from now, unless it has already ended (a
-- renewal on its way at the cut-off must not revive an abandoned record);
-- a zero renewal ends it and is published on ARGV[3] if a reader marked
-- the record watched (see get.lua).
if tonumber(held[3]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'l', string.format('%d', now + tonumber(ARGV[2])))
if tonumber(ARGV[2]) == 0 and held[4] then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1

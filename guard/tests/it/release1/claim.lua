-- Claim: create the record (ARGV: token, lease ms, retention ms, packed
-- request), or return the existing one's fields (packed), with the clock.
local fields = redis.call('HMGET', KEYS[1], 't', 's', 'l', 'e', 'n', 'm', 'p', 'c')
if fields[1] then return {0, now, pack(fields)} end
write_new(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return {1, now}

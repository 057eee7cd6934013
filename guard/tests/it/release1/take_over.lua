-- Take over the record holding token ARGV[1] if its retention or lease
-- ended (ARGV 2..5: the new token, lease ms, retention ms, packed request).
local old = redis.call('HMGET', KEYS[1], 't', 's', 'l', 'e')
if old[1] ~= ARGV[1] then return 0 end
if not (tonumber(old[4]) <= now or (old[2] == 'f' and tonumber(old[3]) <= now)) then return 0 end
redis.call('DEL', KEYS[1])
write_new(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return 1

-- Complete: store the packed response ARGV[2]; publish on ARGV[3] if a
-- reader marked the record watched (see get.lua).
redis.call('HSET', KEYS[1], 's', 'c', 'p', ARGV[2], 'c', now_text)
if held[4] then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1

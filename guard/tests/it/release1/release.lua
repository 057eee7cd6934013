-- Release: delete the in-flight record; publish on ARGV[2] if a reader
-- marked it watched (see get.lua).
redis.call('DEL', KEYS[1])
if held[4] then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1

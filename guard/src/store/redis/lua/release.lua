-- Release (after fence.lua): delete the in-flight record; publish on
-- ARGV[2] if a reader marked it watched.
redis.call('DEL', KEYS[1])
if watched then redis.call('PUBLISH', ARGV[2], KEYS[1]) end
return 1

-- Complete: store the packed response ARGV[2]; publish on ARGV[3].
redis.call('HSET', KEYS[1], 's', 'c', 'p', ARGV[2], 'c', now)
redis.call('PUBLISH', ARGV[3], KEYS[1])
return 1

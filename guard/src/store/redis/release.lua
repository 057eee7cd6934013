-- Release: delete the in-flight record; publish on ARGV[2].
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[1])
return 1

-- Cache a completed record (tiered store): replace the entry whole (one
-- script, so no reader ever sees part of it) and expire it ARGV[1] ms from
-- now (a duration measured on PostgreSQL's clock, so no two clocks are
-- compared); the fields follow as name/value pairs.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1

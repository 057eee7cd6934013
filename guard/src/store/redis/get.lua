-- Get: the record's fields and the clock, in one round trip.
return {now, redis.call('HMGET', KEYS[1], 't', 's', 'l', 'e', 'n', 'm', 'p', 'c')}

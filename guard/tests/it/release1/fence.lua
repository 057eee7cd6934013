-- The fence every later write starts with: the record is in flight and
-- holds token ARGV[1]. `held[4]` tells whether a reader marked it watched.
local held = redis.call('HMGET', KEYS[1], 't', 's', 'l', 'w')
if held[1] ~= ARGV[1] or held[2] ~= 'f' then return 0 end

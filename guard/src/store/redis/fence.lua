-- The fence every later write starts with: the record is in flight and
-- holds token ARGV[1].
local held = redis.call('HMGET', KEYS[1], 't', 's', 'l')
if held[1] ~= ARGV[1] or held[2] ~= 'f' then return 0 end

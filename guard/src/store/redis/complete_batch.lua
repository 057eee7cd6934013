-- Complete a batch: for each key KEYS[i] holding token ARGV[2i] in flight,
-- store the packed response ARGV[2i+1], and publish on ARGV[1] if a reader
-- marked the record watched (see get.lua). Answers one 1 (completed) or 0
-- (the lease was lost) per key.
local answers = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('HMGET', key, 't', 's', 'w')
  if held[1] == ARGV[2 * i] and held[2] == 'f' then
    redis.call('HSET', key, 's', 'c', 'p', ARGV[2 * i + 1], 'c', now_text)
    if held[3] then redis.call('PUBLISH', ARGV[1], key) end
    answers[i] = 1
  else
    answers[i] = 0
  end
end
return answers

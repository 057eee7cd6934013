-- Claim a batch: for each key KEYS[i] (ARGV 4i-3..4i: token, lease ms,
-- retention ms, packed request), create the record, or return the
-- existing one's fields. Answers the clock and one entry per key: 1
-- acquired, or the existing record's fields packed. Every key is in one
-- hash slot.
local answers = {}
for i, key in ipairs(KEYS) do
  local base = (i - 1) * 4
  local fields = redis.call('HMGET', key, 't', 's', 'l', 'e', 'n', 'm', 'p', 'c')
  if fields[1] then
    answers[i] = pack(fields)
  else
    write_new(key, ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4])
    answers[i] = 1
  end
end
return {now, answers}

-- Record steps (after fence.lua and steps.lua): the run's whole list
-- ARGV[2] ('' for none) replaces the one the record keeps, unless the lease
-- has ended (a runner that lapsed records nothing); the expiry and the
-- stored request are kept.
if struct.unpack('>I8', v, LEASE_END) <= since_claim() then return 0 end
local request, _, stored = split_steps(v)
request = with_steps(request, ARGV[2], stored)
redis.call('SET', KEYS[1],
  string.sub(v, 1, REQUEST_LEN - 1) .. struct.pack('>I4', #request) .. request, 'KEEPTTL')
return 1

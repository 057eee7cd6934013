-- Keep a request (after fence.lua and steps.lua): the stored request
-- ARGV[2] ('' for none) replaces the one the record keeps, unless the lease
-- has ended (a runner that lapsed keeps nothing); the expiry and the steps
-- are kept.
if struct.unpack('>I8', v, LEASE_END) <= since_claim() then return 0 end
local request, steps = split_steps(v)
request = with_steps(request, steps, ARGV[2])
redis.call('SET', KEYS[1],
  string.sub(v, 1, REQUEST_LEN - 1) .. struct.pack('>I4', #request) .. request, 'KEEPTTL')
return 1

-- wrk: a fresh Idempotency-Key per request to the payments example.
local n = 0
local threads = 0
local run = tostring(os.time()) .. "-" .. tostring(math.random(1000000))
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
wrk.method = "POST"
wrk.body = '{"amount":100,"currency":"EUR"}'
wrk.headers["Content-Type"] = "application/json"
request = function()
  n = n + 1
  wrk.headers["Idempotency-Key"] = "k-" .. run .. "-" .. id .. "-" .. n
  return wrk.format(nil, "/payments")
end

-- Reads the server's clock in milliseconds; every script that compares
-- times starts with it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

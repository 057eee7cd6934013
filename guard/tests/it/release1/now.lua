-- Reads the server's clock in milliseconds; every script that compares
-- times starts with it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Times are written as text formatted here with %d: a Lua number passed
-- to redis.call is formatted with %.17g, several times dearer.
local now_text = string.format('%d', now)

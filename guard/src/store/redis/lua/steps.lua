-- A record's steps ride in its packed request, after the path and a NUL,
-- behind the flag byte's HAS_STEPS bit (codec.rs: a reader before steps
-- reads them as the path's end). `split_steps(v)` is the packed request of
-- value v without them (the bit cleared) and the steps ('' when none);
-- `with_steps(request, steps)` puts them back.
local function split_steps(v)
  local request = string.sub(v, HEADER + 1, HEADER + struct.unpack('>I4', v, REQUEST_LEN))
  local flags = string.byte(request, 33)
  if math.floor(flags / HAS_STEPS) % 2 == 0 then return request, '' end
  local path_at = 35 + string.byte(request, 34)
  local nul = string.find(request, '\0', path_at, true)
  if not nul then return request, '' end
  return string.sub(request, 1, 32) .. string.char(flags - HAS_STEPS)
      .. string.sub(request, 34, nul - 1), string.sub(request, nul + 1)
end
local function with_steps(request, steps)
  if steps == '' then return request end
  return string.sub(request, 1, 32) .. string.char(string.byte(request, 33) + HAS_STEPS)
      .. string.sub(request, 34) .. '\0' .. steps
end

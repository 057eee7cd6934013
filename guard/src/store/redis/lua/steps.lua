-- A record's steps and stored request ride in its packed request, after
-- the path: a NUL, the steps, and (with HAS_REQUEST) another NUL and the
-- stored request, behind the flag byte's HAS_STEPS and HAS_REQUEST bits
-- (codec.rs: release 1 reads them as the path's end). `split_steps(v)` is
-- the packed request of value v without them (the bits cleared), the steps
-- ('' when none) and the stored request ('' when none);
-- `with_steps(request, steps, stored)` puts them back.
local function split_steps(v)
  local request = string.sub(v, HEADER + 1, HEADER + struct.unpack('>I4', v, REQUEST_LEN))
  local flags = string.byte(request, 33)
  local bits = flags % (2 * HAS_REQUEST) - flags % HAS_STEPS
  if bits == 0 then return request, '', '' end
  local path_at = 35 + string.byte(request, 34)
  local nul = string.find(request, '\0', path_at, true)
  if not nul then return request, '', '' end
  local head = string.sub(request, 1, 32) .. string.char(flags - bits)
      .. string.sub(request, 34, nul - 1)
  local tail = string.sub(request, nul + 1)
  if math.floor(flags / HAS_REQUEST) % 2 == 0 then return head, tail, '' end
  local second = string.find(tail, '\0', 1, true)
  if not second then return head, tail, '' end
  return head, string.sub(tail, 1, second - 1), string.sub(tail, second + 1)
end
local function with_steps(request, steps, stored)
  if steps == '' and stored == '' then return request end
  local flags = string.byte(request, 33)
  local tail = '\0' .. steps
  if steps ~= '' then flags = flags + HAS_STEPS end
  if stored ~= '' then
    flags = flags + HAS_REQUEST
    tail = tail .. '\0' .. stored
  end
  return string.sub(request, 1, 32) .. string.char(flags) .. string.sub(request, 34) .. tail
end

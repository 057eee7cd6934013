-- Packs a record's fields (the HMGET of t s l e n m p c) into one string,
-- so that a reply carries one value per record instead of eight (the
-- client's parsing of each value costs more than the script): the eight
-- lengths as 4-byte big-endian numbers (4294967295 for a missing field),
-- then the present fields' bytes in order. `struct.pack` writes the
-- lengths in C; lengths written as decimal text went through Lua's number
-- formatting (`sprintf`), eight times per record.
local function pack(fields)
  local lengths = {}
  local parts = {''}
  for i = 1, 8 do
    local value = fields[i]
    if value then
      lengths[i] = #value
      parts[#parts + 1] = value
    else
      lengths[i] = 4294967295
    end
  end
  parts[1] = struct.pack('>I4>I4>I4>I4>I4>I4>I4>I4', lengths[1], lengths[2], lengths[3],
    lengths[4], lengths[5], lengths[6], lengths[7], lengths[8])
  return table.concat(parts)
end

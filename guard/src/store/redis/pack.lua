-- Packs a record's fields (the HMGET of t s l e n m p c) into one string,
-- so that a reply carries one value per record instead of eight (the
-- client's parsing of each value costs more than the script): each field
-- as its length in bytes, ':' and its bytes; a missing field as '~'.
local function pack(fields)
  local parts = {}
  for i = 1, 8 do
    local value = fields[i]
    if value then
      parts[i] = #value .. ':' .. value
    else
      parts[i] = '~'
    end
  end
  return table.concat(parts)
end

-- PURGE: drop given dead-letter entries (already archived in PostgreSQL) and their item data.
-- An entry requeued meanwhile is no longer in the list and its item is left alone.
-- KEYS: dead, meta, held   ARGV: entries (exact list values)
-- Returns how many entries were dropped.
local dropped = 0
for _, entry in ipairs(ARGV) do
  if redis.call('LREM', KEYS[1], 1, entry) == 1 then
    local item = cjson.decode(entry).item_id
    redis.call('HDEL', KEYS[2], item)
    if KEYS[3] then held_release(KEYS[3], item) end
    dropped = dropped + 1
  end
end
return dropped

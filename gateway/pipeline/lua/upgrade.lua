-- UPGRADE: move up to `count` best items of a stage's ready ZSET (the layout before the class
-- lists) to the tails of their class lists, keeping their scores. Admin path (`gateway
-- recover`); meant to run before new items arrive, else an old item lands behind newer
-- ones of its class (late, never lost).
-- KEYS: legacy ready zset, meta, the stage's ready lists...   ARGV: count
-- Returns {moved, left in the zset}.
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local moved = 0
for i = 1, #popped, 2 do
  local m = meta_get(KEYS[2], popped[i])
  if m then
    local entry = string.format('%.6f', tonumber(popped[i + 1])) .. '|' .. popped[i]
    redis.call('RPUSH', class_list(3, m), entry)
    moved = moved + 1
  end
end
return {moved, redis.call('ZCARD', KEYS[1])}

-- REQUEUE: move up to `count` dead letters of a stage back to its ready set, counters reset.
-- KEYS: dead, meta, stats, ready lists...   ARGV: count, epoch_ms
-- Returns the ids requeued.
local now = now_ms()
local out = {}
for _ = 1, tonumber(ARGV[1]) do
  local entry = redis.call('LPOP', KEYS[1])
  if not entry then break end
  local item = cjson.decode(entry).item_id
  local m = meta_get(KEYS[2], item)
  if m and m.status == 'x' then
    m.status = 'q'
    m.failures = 0
    m.reclaims = 0
    meta_put(KEYS[2], item, m)
    ready_push(4, m, now, tonumber(ARGV[2]), item)
    redis.call('HINCRBY', KEYS[3], 'enqueued', 1)
    out[#out + 1] = item
  end
end
return out

-- ADD: enqueue an item into a stage unless it was seen within the dedup window, and within
-- its owner's quota.
-- KEYS: seen bucket (hash item -> first seen ms), meta, stats(stage), the stage's ready list
--       of the item's class, the owner's quota hash (item -> payload bytes, '~bytes' -> sum),
--       the held hash (admission by class, see the prelude)
-- ARGV: item, payload ('' = none), base, bonus, window_ms, force(0|1), stage, epoch_ms,
--       trim_sample, quota_items, quota_bytes (0 and 0: no quota, the hash is not touched),
--       admission class ('' = none: not counted), the class's limit of everything held
--       (bytes of cost, 0 = none)
-- force=1 (recover, requeue) skips the seen check but never duplicates a present item.
-- Returns 1 when enqueued, 0 when a duplicate, -3 when over the owner's quota, -4 when the
-- items held would pass the class's limit.
local item = ARGV[1]
local now = now_ms()
local expired_at = now - tonumber(ARGV[5])  -- first seen at or before this: outside the window
-- Trim a bounded random sample of this bucket once it holds more than TRIM_FROM entries
-- (exactness does not depend on it: the item's own entry is checked below; the sample only
-- keeps buckets from keeping dead entries). A smaller bucket keeps its dead entries: at most
-- TRIM_FROM per bucket, ~2 MB over the 1024 buckets, for skipping the sample (~10 µs of the
-- script's ~75 µs) wherever a week holds fewer than ~64 x 1024 items; above that every ADD
-- samples, as before.
local TRIM_FROM = 64
if redis.call('HLEN', KEYS[1]) > TRIM_FROM then
  local sample = redis.call('HRANDFIELD', KEYS[1], tonumber(ARGV[9]), 'WITHVALUES')
  for i = 1, #sample, 2 do
    if tonumber(sample[i + 1]) <= expired_at then redis.call('HDEL', KEYS[1], sample[i]) end
  end
end
local first = redis.call('HGET', KEYS[1], item)
if first and tonumber(first) <= expired_at then
  redis.call('HDEL', KEYS[1], item)
  first = false
end
if ARGV[6] ~= '1' and first then return 0 end
if redis.call('HEXISTS', KEYS[2], item) == 1 then return 0 end
local class = ARGV[12] or ''
local cost = item_cost(#ARGV[2])
local held = class ~= '' and held_read(KEYS[6], class, item)
if held then
  local limit = tonumber(ARGV[13])
  if limit > 0 and tonumber(held[1] or '0') + cost > limit then return -4 end
end
local max_items, max_bytes = tonumber(ARGV[10]), tonumber(ARGV[11])
if (max_items > 0 or max_bytes > 0)
    and not quota_take(KEYS[5], KEYS[2], item, #ARGV[2], max_items, max_bytes) then
  return -3
end
if held then held_take(KEYS[6], class, item, cost, held) end
if not first then redis.call('HSET', KEYS[1], item, now) end
-- The meta's numbers as text, as ARGV gives them (integers, from add_call): meta_put joins
-- them as they are instead of formatting five numbers back into text (~5 % of the script).
local m = {stage = ARGV[7], status = 'q', base = ARGV[3], bonus = ARGV[4],
           failures = '0', reclaims = '0', priority = ARGV[3], payload = ARGV[2]}
meta_put(KEYS[2], item, m)
ready_push(4, m, now, tonumber(ARGV[8]), item)
redis.call('HINCRBY', KEYS[3], 'enqueued', 1)
return 1

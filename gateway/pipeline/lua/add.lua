-- ADD: enqueue an item into a stage unless it was seen within the dedup window.
-- KEYS: seen(zset item->first seen ms), meta, ready(stage), stats(stage)
-- ARGV: item, payload ('' = none), base, bonus, window_ms, force(0|1), stage, epoch_ms,
--       trim_batch
-- force=1 (recover, requeue) skips the seen check but never duplicates a present item.
-- Returns 1 when enqueued, 0 when a duplicate.
local item = ARGV[1]
local now = now_ms()
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[5]),
                       'LIMIT', 0, tonumber(ARGV[9]))
if #old > 0 then redis.call('ZREM', KEYS[1], unpack(old)) end
if ARGV[6] ~= '1' and redis.call('ZSCORE', KEYS[1], item) then return 0 end
if redis.call('HEXISTS', KEYS[2], item) == 1 then return 0 end
redis.call('ZADD', KEYS[1], 'NX', now, item)
local m = {stage = ARGV[7], status = 'q', base = tonumber(ARGV[3]), bonus = tonumber(ARGV[4]),
           failures = 0, reclaims = 0, payload = ARGV[2]}
meta_put(KEYS[2], item, m)
redis.call('ZADD', KEYS[3], score(m, now, tonumber(ARGV[8])), item)
redis.call('HINCRBY', KEYS[4], 'enqueued', 1)
return 1

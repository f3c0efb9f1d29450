-- FETCH: promote due delayed retries (bounded batch), pop the best item, record a lease.
-- KEYS: ready, delayed, lease, deadline, meta, doc
-- ARGV: worker, token, lease_ms, promote_batch, epoch_ms
-- Returns false when the stage is empty, else {item, started_ms, payload or '', meta fields:
-- base, bonus, failures, reclaims}.
local now = now_ms()
local epoch = tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[2], id)
  local m = meta_get(KEYS[5], id)
  if m then
    m.status = 'q'
    meta_put(KEYS[5], id, m)
    redis.call('ZADD', KEYS[1], score(m, now, epoch), id)
  end
end
local popped = redis.call('ZPOPMIN', KEYS[1])
if #popped == 0 then return false end
local item = popped[1]
local m = meta_get(KEYS[5], item)
if not m then return false end
m.status = 'r'
meta_put(KEYS[5], item, m)
redis.call('HSET', KEYS[3], item, ARGV[2] .. '|' .. ARGV[1] .. '|' .. now)
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), item)
local payload = redis.call('HGET', KEYS[6], item) or ''
return {item, tostring(now), payload, tostring(m.base), tostring(m.bonus),
        tostring(m.failures), tostring(m.reclaims)}

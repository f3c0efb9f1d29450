-- FETCH: promote due delayed retries (bounded batch), pop up to `count` best items, record a
-- lease {token, worker, started} and a deadline for each.
-- KEYS: ready, delayed, lease, deadline, meta
-- ARGV: worker, token, lease_ms, promote_batch, epoch_ms, count
-- Returns false when the stage is empty, else a flat list of 7 fields per item: item,
-- started_ms, payload or '', base, bonus, failures, reclaims.
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
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[6]))
if #popped == 0 then return false end
local lease = ARGV[2] .. '|' .. ARGV[1] .. '|' .. now
local deadline = now + tonumber(ARGV[3])
local out = {}
for i = 1, #popped, 2 do
  local item = popped[i]
  local m = meta_get(KEYS[5], item)
  if m then
    m.status = 'r'
    meta_put(KEYS[5], item, m)
    redis.call('HSET', KEYS[3], item, lease)
    redis.call('ZADD', KEYS[4], deadline, item)
    for _, v in ipairs({item, tostring(now), m.payload, tostring(m.base), tostring(m.bonus),
                        tostring(m.failures), tostring(m.reclaims)}) do
      out[#out + 1] = v
    end
  end
end
if #out == 0 then return false end
return out

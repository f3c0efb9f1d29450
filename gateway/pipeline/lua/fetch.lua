-- FETCH: promote due delayed retries (bounded batch), pop up to `count` best items, record a
-- lease {token, worker, started} and a deadline for each.
-- KEYS: delayed, lease, deadline, meta, the stage's ready lists...
-- ARGV: worker, token, lease_ms, promote_batch, epoch_ms, count, stage[, max_bytes]
-- max_bytes (0 or absent: none) bounds the batch's payload bytes: the first item is always
-- taken, and the pop ends before an item that would pass the bound (it stays first in line),
-- so a batch of large documents holds a bounded amount of a worker's memory.
-- Returns false when the stage is empty, else a flat list of 8 fields per item: item,
-- started_ms, payload (store stage; '' at the others), base, bonus, failures, reclaims,
-- priority (submitted base).
-- A popped entry whose meta does not say "queued in this stage" is stale and skipped (lazy
-- deletion: nothing removes a given item from a ready list).
local now = now_ms()
local epoch = tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local m = meta_get(KEYS[4], id)
  if m then
    m.status = 'q'
    meta_put(KEYS[4], id, m)
    ready_push(5, m, now, epoch, id)
  end
end
local count = tonumber(ARGV[6])
local lease = ARGV[2] .. '|' .. ARGV[1] .. '|' .. now
local deadline = now + tonumber(ARGV[3])
local out = {}
local max_bytes, bytes, full = tonumber(ARGV[8] or '0'), 0, false
local function take(item)
  local m = meta_get(KEYS[4], item)
  if not (m and m.status == 'q' and m.stage == ARGV[7]) then return true end  -- stale: dropped
  if max_bytes > 0 and #out > 0 and bytes + #m.payload > max_bytes then
    full = true
    return false
  end
  bytes = bytes + #m.payload
  m.status = 'r'
  meta_put(KEYS[4], item, m)
  redis.call('HSET', KEYS[2], item, lease)
  redis.call('ZADD', KEYS[3], deadline, item)
  -- The document goes out with the store stage only: the later stages read what store wrote.
  local payload = ARGV[7] == 'store' and m.payload or ''
  for _, v in ipairs({item, tostring(now), payload, tostring(m.base), tostring(m.bonus),
                      tostring(m.failures), tostring(m.reclaims), tostring(m.priority)}) do
    out[#out + 1] = v
  end
  return true
end
-- Stale entries leave a batch short: pop again for the rest, a bounded number of times.
for _ = 1, 4 do
  local want = count - #out / 8
  if want <= 0 or full then break end
  if #ready_pop(5, want, take) == 0 then break end
end
if #out == 0 then return false end
return out

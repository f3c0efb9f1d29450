-- COMPLETE: the token holder finished the stage; move the item into the next stage.
-- KEYS: lease, deadline, meta, stats, then either [next stats, the next stage's ready list of
--       the item's class, or all of its ready lists] or, at the last stage, [held] (the item
--       leaves the pipeline: its admission class gets its cost back)
-- ARGV: item, token, next_stage ('' = final), epoch_ms, drop_payload(0|1)[, more items]
-- Returns 1, or -1 (no lease) / -2 (another token holds it); with more items (leased under
-- the same token: one FETCH's batch), a list of those answers, one per item in ARGV order,
-- each item completed as if alone (the next stage's keys then hold all of its ready lists).
local function complete(item)
local code = check_lease(KEYS[1], item, ARGV[2])
if code ~= 1 then return code end
local m, list = nil, nil
if ARGV[3] ~= '' then
  m = meta_get(KEYS[3], item)
  list = class_list(6, m)  -- before any write: a wrong class key fails without side effects
end
redis.call('HDEL', KEYS[1], item)
redis.call('ZREM', KEYS[2], item)
redis.call('HINCRBY', KEYS[4], 'completed', 1)
if not m then
  redis.call('HDEL', KEYS[3], item)
  if KEYS[5] then held_release(KEYS[5], item) end
  return 1
end
m.stage = ARGV[3]
m.status = 'q'
m.failures = 0
m.reclaims = 0
if ARGV[5] == '1' then m.payload = '' end
meta_put(KEYS[3], item, m)
redis.call('RPUSH', list, score(m, now_ms(), tonumber(ARGV[4])) .. '|' .. item)
redis.call('HINCRBY', KEYS[5], 'enqueued', 1)
return 1
end
if #ARGV <= 5 then return complete(ARGV[1]) end
local out = {complete(ARGV[1])}
for i = 6, #ARGV do out[#out + 1] = complete(ARGV[i]) end
return out

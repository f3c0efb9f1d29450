-- RECLAIM: leases past their deadline go back to the stage with the reclaim base priority, or
-- to the dead letters after max_reclaims. Bounded by `batch`; atomic, so several processes
-- may run it at once and each expired lease is handled exactly once.
-- KEYS: lease, deadline, dead, meta, stats, ready lists...
-- ARGV: batch, max_reclaims, reclaim_base, epoch_ms
-- Returns {reclaimed, dead_lettered, more (0|1)}.
local now = now_ms()
local batch = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
local back, dead = 0, 0
for _, item in ipairs(expired) do
  redis.call('ZREM', KEYS[2], item)
  redis.call('HDEL', KEYS[1], item)
  local m = meta_get(KEYS[4], item)
  if m then
    m.reclaims = m.reclaims + 1
    redis.call('HINCRBY', KEYS[5], 'reclaimed', 1)
    if m.reclaims > tonumber(ARGV[2]) then
      dead_letter(KEYS[3], KEYS[4], KEYS[5], item, m, 'lease expired', now)
      dead = dead + 1
    else
      m.base = tonumber(ARGV[3])
      m.status = 'q'
      meta_put(KEYS[4], item, m)
      ready_push(6, m, now, tonumber(ARGV[4]), item)
      back = back + 1
    end
  end
end
local more = 0
if #expired == batch then more = 1 end
return {back, dead, more}

-- Concurrency slots (prepended after clock.lua): a ZSET of holder ids scored by their lease
-- deadline (µs), so a crashed holder's slot frees itself when its lease ends.

-- 0 when `holder` may hold a slot of `key` (it holds one, or fewer than `limit` are held),
-- else the µs until the earliest lease ends. Ended leases are dropped only when the slots
-- look full (one command while there is room, instead of three): with fewer than `limit`
-- members, live or not, there is room; members never exceed `limit`, so a holder whose own
-- lease ended renews in its place, as it would once the ended leases were dropped.
local function slot_wait(key, holder, limit, now)
  if redis.call('ZCARD', key) < limit or redis.call('ZSCORE', key, holder) then return 0 end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  if redis.call('ZCARD', key) < limit then return 0 end
  local earliest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
  local wait = earliest - now
  if wait < 1 then wait = 1 end
  return wait
end

-- Take (or renew) `holder`'s slot until now + lease; the key lives as long as its longest.
local function slot_take(key, holder, lease, now)
  redis.call('ZADD', key, fmt(now + lease), holder)
  local longest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', key, math.ceil((longest - now) / 1000) + 1)
end

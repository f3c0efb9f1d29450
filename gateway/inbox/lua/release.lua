-- RELEASE: the holder gives a chat back, ready again after `delay_ms`: after a failure of
-- its head entry (counted; past `max_failures` the head is dead-lettered), or when a store
-- is unreachable or the process stops (not counted: the entry is not at fault). An entry
-- that cannot even be decoded is dead-lettered at once (`max_failures` 1).
-- KEYS: ready, leases, owners, failures, chat list, dead, sent, takes
-- ARGV: chat, token, delay_ms, counted (1 or 0), max_failures, dead_max
-- Returns -1 when the lease is not the caller's, 2 when the head was dead-lettered, else 1.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return -1 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
local dead = false
if ARGV[4] == '1' then
  dead = count_failure(KEYS[4], KEYS[6], {KEYS[7], KEYS[8]}, KEYS[5], ARGV[1],
                       tonumber(ARGV[5]), tonumber(ARGV[6]))
end
if redis.call('LLEN', KEYS[5]) > 0 then
  redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[3]), ARGV[1])
end
if dead then return 2 end
return 1

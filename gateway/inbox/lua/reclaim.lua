-- RECLAIM: chats whose lease ran out (the holder died or stalled past it) are ready again at
-- once. Each reclaim counts as a failure of the head entry, so an entry that keeps killing
-- its holders ends as a dead letter instead of taking every replica down in turn.
-- KEYS: ready, leases, owners, failures, dead, sent, takes
-- ARGV: limit, max_failures, dead_max, chat list key prefix
-- Returns the number of chats reclaimed.
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, chat in ipairs(expired) do
  redis.call('ZREM', KEYS[2], chat)
  redis.call('HDEL', KEYS[3], chat)
  local list = ARGV[4] .. chat
  count_failure(KEYS[4], KEYS[5], {KEYS[6], KEYS[7]}, list, chat, tonumber(ARGV[2]),
                tonumber(ARGV[3]))
  if redis.call('LLEN', list) > 0 then redis.call('ZADD', KEYS[1], now, chat) end
end
return #expired

-- ACK: the chat's head entry is processed: drop it, and hand the holder the next entry with
-- its lease renewed, or give the chat up when none is left.
-- KEYS: leases, owners, failures, chat list, sent, takes
-- ARGV: chat, token, the processed entry, lease_ms
-- Returns false when the lease is no longer the caller's, '' when the chat is done, else
-- the next entry.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return false end
if redis.call('LINDEX', KEYS[4], 0) == ARGV[3] then redis.call('LPOP', KEYS[4]) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
local head = redis.call('LINDEX', KEYS[4], 0)
if head then
  redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[4]), ARGV[1])
  redis.call('HSET', KEYS[6], ARGV[1], 1)  -- the holder takes it now
  return head
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
return ''

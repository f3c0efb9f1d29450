-- TAKE: lease up to `count` ready chats, longest waiting first, to one holder.
-- KEYS: ready, leases, owners, failures, takes
-- ARGV: token, lease_ms, count, chat list key prefix
-- Returns a flat list: chat, head entry, earlier attempts at the head (failed, reclaimed, or
-- given back uncounted: a store outage, a shutdown), chat, ...
local now = now_ms()
local deadline = now + tonumber(ARGV[2])
local chats = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, chat in ipairs(chats) do
  redis.call('ZREM', KEYS[1], chat)
  local head = redis.call('LINDEX', ARGV[4] .. chat, 0)
  if head then
    redis.call('ZADD', KEYS[2], deadline, chat)
    redis.call('HSET', KEYS[3], chat, ARGV[1])
    out[#out + 1] = chat
    out[#out + 1] = head
    local before = redis.call('HINCRBY', KEYS[5], chat, 1) - 1
    out[#out + 1] = math.max(before, tonumber(redis.call('HGET', KEYS[4], chat) or '0'))
  end
end
return out

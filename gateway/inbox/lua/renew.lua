-- RENEW: extend the leases one holder still has.
-- KEYS: leases, owners
-- ARGV: lease_ms, then chat, token pairs
-- Returns the chats that are no longer the holder's.
local deadline = now_ms() + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost

-- PUSH: claim the event (when a claim key is given) and append it to its chat's list, in
-- one step: acknowledged means durable. The chat becomes ready unless a consumer holds it
-- (the holder takes the following entries itself, in order).
-- KEYS: ready, leases, chat list[, claim]
-- ARGV: chat, entry, max entries per chat, claim TTL in seconds
-- Returns 1 accepted, 0 duplicate (the claim exists), -1 the chat's list is full.
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
if redis.call('LLEN', KEYS[3]) >= tonumber(ARGV[3]) then return -1 end
if KEYS[4] then redis.call('SET', KEYS[4], 'done', 'EX', ARGV[4]) end
redis.call('RPUSH', KEYS[3], ARGV[2])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'NX', now_ms(), ARGV[1])
end
return 1

-- Extend a lease, only for the holder of the token (a lost lease is never revived), and the
-- fencing counter's life with it: a counter that expired under a long-lived holder would
-- hand its successor token 1 again, and a dead holder's tokens would look current.
-- KEYS[1] lease hash; KEYS[2] fencing counter (same hash tag).
-- ARGV[1] holder id; ARGV[2] token; ARGV[3] lease ms; ARGV[4] counter ttl ms. Returns 1 or 0.
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] == ARGV[1] and current[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0

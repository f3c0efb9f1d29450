-- Extend a lease, only for the holder of the token (a lost lease is never revived).
-- KEYS[1] lease hash; ARGV[1] holder id; ARGV[2] token; ARGV[3] lease ms. Returns 1 or 0.
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] == ARGV[1] and current[2] == ARGV[2] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0

-- Give a lease up, only for the holder of the token (never drop a successor's lease).
-- KEYS[1] lease hash; ARGV[1] holder id; ARGV[2] token. Returns 1 when released, 0 otherwise.
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] == ARGV[1] and current[2] == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0

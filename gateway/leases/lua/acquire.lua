-- Take a single-holder lease if it is free (or already ours), with a fresh fencing token.
-- KEYS[1] lease hash {holder, token}; KEYS[2] fencing counter (same hash tag).
-- ARGV[1] holder id; ARGV[2] lease ms; ARGV[3] counter ttl ms.
-- Returns the token (string) on success, false when someone else holds the lease.
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder then
  if holder ~= ARGV[1] then
    return false
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return redis.call('HGET', KEYS[1], 'token')
end
local token = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return tostring(token)

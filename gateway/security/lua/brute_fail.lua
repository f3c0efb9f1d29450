-- Count one signature failure of a client; block it for a cool-down at the threshold.
-- KEYS[1] failure counter, KEYS[2] block flag (same hash tag: the client address).
-- ARGV[1] threshold, ARGV[2] window seconds, ARGV[3] cool-down seconds.
-- Returns the remaining block time in seconds (0 when the client is not blocked).
local failures = redis.call('INCR', KEYS[1])
if failures == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
if failures >= tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
  redis.call('DEL', KEYS[1])
  return tonumber(ARGV[3])
end
return 0

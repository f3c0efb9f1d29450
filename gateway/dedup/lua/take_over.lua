-- Hand an in-progress dedup claim to a new holder, only if it still holds the value the
-- caller read (compare-and-set: a holder that marked it done or released it meanwhile wins).
-- KEYS[1] claim key; ARGV[1] the value read, ARGV[2] the new token, ARGV[3] TTL in seconds.
-- Returns 1 when taken over, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0

-- Delete a dedup claim only if it still holds the caller's token.
-- KEYS[1] claim key; ARGV[1] token. Returns 1 when released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

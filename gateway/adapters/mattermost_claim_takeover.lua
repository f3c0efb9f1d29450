-- Take over a dedup claim left in progress by a previous listener lease holder.
-- KEYS[1] claim key; ARGV[1] the value we read (the old holder's in-progress token);
-- ARGV[2] our new token; ARGV[3] ttl seconds. Returns 1 when the claim is now ours, else 0
-- (it changed meanwhile: done, released or taken by someone else).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0

-- The first delivery of a signed body within the replay window marks it with its delivery id.
-- KEYS[1] dedup:webhook-body:<source>:<sha256 of the body>
-- ARGV[1] the delivery id, ARGV[2] the window in seconds
-- Returns the delivery id that holds the mark: ARGV[1] when this delivery is the first (or a
-- redelivery of the first), another id when this body was delivered before under it.
local held = redis.call('GET', KEYS[1])
if held then
  return held
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]

-- PUBLISH several push signals in one call: ARGV = channel, message, channel, message, ...
-- (in that order: a topic's signals go out in offset order). Returns how many were sent.
for i = 1, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return #ARGV / 2

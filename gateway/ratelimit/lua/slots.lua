-- Concurrency slots on Redis time: at most `limit` holders, each with a lease that expires
-- (a crashed holder cannot keep a slot forever).
--
-- KEYS[1]  rl:slots:<name>, a ZSET: member = holder id, score = lease deadline in µs
-- ARGV[1]  limit, ARGV[2] lease µs, ARGV[3] holder id, ARGV[4] "now" µs or empty = Redis TIME
-- Returns {1, '0'} when the slot is held (new or renewed), else {0, wait µs until the
-- earliest lease ends}.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local now = clock(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
if redis.call('ZSCORE', key, ARGV[3]) or redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, fmt(now + lease), ARGV[3])
  local longest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', key, math.ceil((longest - now) / 1000) + 1)
  return {1, '0'}
end
local earliest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
local wait = earliest - now
if wait < 1 then wait = 1 end
return {0, fmt(wait)}

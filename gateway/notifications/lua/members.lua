-- One delivering process says it is alive and learns how many are: a sorted set of members
-- scored by the (Redis) time their mark expires. Expired marks are dropped first.
-- KEYS[1] members zset; ARGV[1] member id; ARGV[2] mark lifetime ms. Returns the count.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])

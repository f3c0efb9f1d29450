-- Change the cost of an admitted entry, keeping its admission time: a provider call is
-- admitted on an estimate of its tokens and settled on the count the provider reports.
-- More than estimated may take the window over its limit (later attempts then wait longer);
-- less gives the difference back at once. An entry that has left the window is not touched.
--
-- KEYS[1], KEYS[2]  the log and its total; ARGV[1] the attempt id, ARGV[2] the old cost,
-- ARGV[3] the new cost (0 removes the entry), ARGV[4] the window µs (the keys' expiry).
-- Returns 1 if amended, 0 if not found.
local key, total_key = KEYS[1], KEYS[2]
local old_member = ARGV[1] .. ':' .. ARGV[2]
local score = redis.call('ZSCORE', key, old_member)
if not score then return 0 end
local old_cost, new_cost = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREM', key, old_member)
if new_cost > 0 then
  redis.call('ZADD', key, score, ARGV[1] .. ':' .. fmt(new_cost))
  redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[4]) / 1000) + 1)
end
local total = tonumber(redis.call('GET', total_key))
if total ~= nil then
  total = total - old_cost + new_cost
  if total > 0 then redis.call('SET', total_key, fmt(total), 'KEEPTTL')
  else redis.call('DEL', total_key) end
end
return 1

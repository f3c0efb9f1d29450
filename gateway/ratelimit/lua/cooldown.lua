-- A group's cool-down (a provider's 429 with Retry-After): a deadline on Redis time that
-- windows.lua reads before admitting anything of the group. The later deadline wins, so a
-- shorter Retry-After arriving after a longer one does not cut it short.
--
-- KEYS[1]  rl:cooldown:{<tag>} (the hash tag of the group's logs)
-- ARGV[1]  the cool-down in µs (> 0), ARGV[2] "now" in µs or empty = Redis TIME
-- Returns the deadline in µs (a string).
local now = clock(ARGV[2])
local wait = tonumber(ARGV[1])
local deadline = now + wait
local held = tonumber(redis.call('GET', KEYS[1]))
if held and held >= deadline then return fmt(held) end
redis.call('SET', KEYS[1], fmt(deadline), 'PX', math.ceil(wait / 1000))
return fmt(deadline)

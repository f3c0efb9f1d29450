-- Concurrency slots on Redis time: at most `limit` holders, each with a lease that expires
-- (a crashed holder cannot keep a slot forever).
--
-- KEYS[1]  rl:slots:<name>, a ZSET: member = holder id, score = lease deadline in µs
-- ARGV[1]  limit, ARGV[2] lease µs, ARGV[3] holder id, ARGV[4] "now" µs or empty = Redis TIME
-- Returns {1, '0'} when the slot is held (new or renewed), else {0, wait µs until the
-- earliest lease ends}.
local now = clock(ARGV[4])
local wait = slot_wait(KEYS[1], ARGV[3], tonumber(ARGV[1]), now)
if wait > 0 then return {0, fmt(wait)} end
slot_take(KEYS[1], ARGV[3], tonumber(ARGV[2]), now)
return {1, '0'}

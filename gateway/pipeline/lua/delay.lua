-- DELAY: the token holder's item cannot run now but will later (its AI budget is spent):
-- back to the stage's delayed set until now + delay_ms, like a retry, but no failure is
-- counted, so waiting never leads to the dead letters.
-- KEYS: lease, deadline, delayed, meta, stats   ARGV: item, token, delay_ms
-- Returns {'delayed', ready_at_ms}, or -1 / -2 like HEARTBEAT.
local item = ARGV[1]
local code = end_lease(KEYS[1], KEYS[2], item, ARGV[2])
if code ~= 1 then return code end
local m = meta_get(KEYS[4], item)
m.status = 'w'
meta_put(KEYS[4], item, m)
redis.call('HINCRBY', KEYS[5], 'delayed', 1)
local ready_at = now_ms() + tonumber(ARGV[3])
redis.call('ZADD', KEYS[3], ready_at, item)
return {'delayed', tostring(ready_at)}

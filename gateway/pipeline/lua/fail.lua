-- FAIL: the token holder's handler failed. Retry after exponential backoff with jitter, or
-- dead-letter after max_failures.
-- KEYS: lease, deadline, delayed, dead, meta, stats
-- ARGV: item, token, max_failures, base_ms, cap_ms, jitter (0..1 from the client), reason
-- Returns {'retry', ready_at_ms} or {'dead', now_ms}, or -1 / -2 like HEARTBEAT.
local item = ARGV[1]
local code = end_lease(KEYS[1], KEYS[2], item, ARGV[2])
if code ~= 1 then return code end
local now = now_ms()
local m = meta_get(KEYS[5], item)
m.failures = m.failures + 1
redis.call('HINCRBY', KEYS[6], 'failed', 1)
if m.failures >= tonumber(ARGV[3]) then
  dead_letter(KEYS[4], KEYS[5], KEYS[6], item, m, ARGV[7], now)
  return {'dead', tostring(now)}
end
-- "equal jitter": half the exponential delay fixed, half random.
local delay = math.min(tonumber(ARGV[5]), tonumber(ARGV[4]) * 2 ^ (m.failures - 1))
local ready_at = now + math.floor(delay / 2 + delay / 2 * tonumber(ARGV[6]))
m.status = 'w'
meta_put(KEYS[5], item, m)
redis.call('ZADD', KEYS[3], ready_at, item)
return {'retry', tostring(ready_at)}

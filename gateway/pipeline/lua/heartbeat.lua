-- HEARTBEAT: extend the lease of the token holder.
-- KEYS: lease, deadline   ARGV: item, token, lease_ms
-- Returns the new deadline (ms, string) or -1 (no lease) / -2 (another token holds it).
local code = check_lease(KEYS[1], ARGV[1], ARGV[2])
if code ~= 1 then return code end
local deadline = now_ms() + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], 'XX', deadline, ARGV[1])
return tostring(deadline)

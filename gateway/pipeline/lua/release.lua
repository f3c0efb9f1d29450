-- RELEASE: the token holder gives the item back untouched (graceful shutdown): no failure or
-- reclaim is counted and it keeps its priority.
-- KEYS: lease, deadline, meta, ready lists...   ARGV: item, token, epoch_ms
-- Returns 1, or -1 (no lease) / -2 (another token holds it).
local item = ARGV[1]
local code = end_lease(KEYS[1], KEYS[2], item, ARGV[2])
if code ~= 1 then return code end
local m = meta_get(KEYS[3], item)
m.status = 'q'
meta_put(KEYS[3], item, m)
ready_push(4, m, now_ms(), tonumber(ARGV[3]), item)
return 1

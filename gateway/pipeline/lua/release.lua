-- RELEASE: the token holder gives the item back untouched (graceful shutdown): no failure or
-- reclaim is counted and it keeps its priority.
-- KEYS: lease, deadline, meta, ready lists...   ARGV: item, token, epoch_ms[, more items]
-- Returns 1, or -1 (no lease) / -2 (another token holds it); with more items (leased under
-- the same token), a list of those answers, one per item in ARGV order, each item released
-- as if alone.
local now = now_ms()
local function release(item)
  local code = end_lease(KEYS[1], KEYS[2], item, ARGV[2])
  if code ~= 1 then return code end
  local m = meta_get(KEYS[3], item)
  m.status = 'q'
  meta_put(KEYS[3], item, m)
  ready_push(4, m, now, tonumber(ARGV[3]), item)
  return 1
end
if #ARGV <= 3 then return release(ARGV[1]) end
local out = {release(ARGV[1])}
for i = 4, #ARGV do out[#out + 1] = release(ARGV[i]) end
return out

-- HEARTBEAT: extend the lease of the token holder.
-- KEYS: lease, deadline   ARGV: item, token, lease_ms[, more items]
-- Returns the new deadline (ms, string) or -1 (no lease) / -2 (another token holds it); with
-- more items (leased under the same token: one FETCH's batch), a list of those answers, one
-- per item in ARGV order, read with one HMGET and extended with one ZADD XX.
local token = ARGV[2]
local items = {ARGV[1]}
for i = 4, #ARGV do items[#items + 1] = ARGV[i] end
local held = call_many('HMGET', KEYS[1], items)
local deadline = tostring(now_ms() + tonumber(ARGV[3]))
local out, extend = {}, {}
for i, item in ipairs(items) do
  local raw = held[i]
  if not raw then
    out[i] = -1
  elseif string.match(raw, '^([^|]*)|') ~= token then
    out[i] = -2
  else
    out[i] = deadline
    extend[#extend + 1] = deadline
    extend[#extend + 1] = item
  end
end
if #extend > 0 then call_many('ZADD', KEYS[2], extend, 'XX') end
if #ARGV <= 3 then return out[1] end
return out

-- Change the cost of an admitted entry, keeping its admission time: a provider call is
-- admitted on an estimate of its tokens and settled on the count the provider reports.
-- More than estimated may take the window over its limit (later attempts then wait longer);
-- less gives the difference back at once. An entry that has left the window is not touched.
-- The same call may give back the attempt's concurrency slot (a provider call's end: its
-- settlement and its slot in one script call).
--
-- KEYS[1], KEYS[2]  the log and its total; ARGV[1] the attempt id, ARGV[2] the old cost,
-- ARGV[3] the new cost (0 removes the entry; empty: no change). KEYS[3] optional: the
-- group's slots, whose member ARGV[4] is removed.
-- Returns 1 if amended, 0 if not found (or not asked).
local function amend(key, total_key, attempt, old_cost, new_cost)
  local old_member = attempt .. ':' .. fmt(old_cost)
  local score = redis.call('ZSCORE', key, old_member)
  if not score then return 0 end
  redis.call('ZREM', key, old_member)
  -- The log's expiry, set at this entry's admission or a later one, already outlives it.
  if new_cost > 0 then redis.call('ZADD', key, score, attempt .. ':' .. fmt(new_cost)) end
  local total = tonumber(redis.call('GET', total_key))
  if total ~= nil then
    total = total - old_cost + new_cost
    if total > 0 then redis.call('SET', total_key, fmt(total), 'KEEPTTL')
    else redis.call('DEL', total_key) end
  end
  return 1
end

local done = 0
if ARGV[3] ~= '' then
  done = amend(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
end
if KEYS[3] then redis.call('ZREM', KEYS[3], ARGV[4]) end
return done

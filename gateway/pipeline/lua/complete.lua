-- COMPLETE: the token holder finished the stage; move the item into the next stage.
-- KEYS: lease, deadline, meta, stats, then either [next stats, the next stage's ready list of
--       the item's class, or all of its ready lists] or, at the last stage, [held] (the item
--       leaves the pipeline: its admission class gets its cost back)
-- ARGV: item, token, next_stage ('' = final), epoch_ms, drop_payload(0|1)[, more items]
-- Returns 1, or -1 (no lease) / -2 (another token holds it); with more items (leased under
-- the same token: one FETCH's batch), a list of those answers, one per item in ARGV order,
-- each item completed as if alone (the next stage's keys then hold all of its ready lists).
-- The batch is read and written by a few commands for all of its items (one HMGET of the
-- leases and one of the metas, one HDEL, ZREM, HSET, and one RPUSH per class list), and
-- every item of one call is scored with one TIME: a command per item each would cost most
-- of the script's time. Every read and check comes before the first write, so a wrong
-- class key fails the whole call without side effects.
-- held_release for a batch: one read and one HDEL for all, one HINCRBY per class.
local function held_release_many(key, done)
  local entries = call_many('HMGET', key, done)
  local gone, costs, classes, total = {}, {}, {}, 0
  for i = 1, #done do
    if entries[i] then
      local class, cost = string.match(entries[i], '^(.*)|(%d+)$')
      gone[#gone + 1] = done[i]
      if not costs[class] then
        costs[class] = 0
        classes[#classes + 1] = class
      end
      costs[class] = costs[class] + tonumber(cost)
      total = total + tonumber(cost)
    end
  end
  if #gone == 0 then return end
  call_many('HDEL', key, gone)
  for _, class in ipairs(classes) do
    redis.call('HINCRBY', key, 'bytes ' .. class, -costs[class])
  end
  redis.call('HINCRBY', key, HELD_ALL, -total)
end

local token, after = ARGV[2], ARGV[3]
local items = {ARGV[1]}
for i = 6, #ARGV do items[#items + 1] = ARGV[i] end
local held = call_many('HMGET', KEYS[1], items)
local codes, done, seen = {}, {}, {}
for i, item in ipairs(items) do
  local raw = held[i]
  if seen[item] or not raw then
    codes[i] = -1  -- nobody holds it (or it was completed earlier in this call)
  elseif string.match(raw, '^([^|]*)|') ~= token then
    codes[i] = -2
  else
    codes[i] = 1
    seen[item] = true
    done[#done + 1] = item
  end
end
if #done > 0 then
  local puts, pushes, order = {}, {}, {}
  if after ~= '' then
    local raws = call_many('HMGET', KEYS[3], done)
    local lists, scores = {}, {}  -- class -> its list key, its entries' score
    local stamp = (now_ms() - tonumber(ARGV[4])) / 1000000
    local drop = ARGV[5] == '1'
    local queued = after .. '|q|'
    for i, item in ipairs(done) do
      local raw = raws[i]
      -- base and bonus, and where "priority|payload" starts (failures and reclaims are
      -- reset); an entry from before priority was kept, or a dropped payload, takes the
      -- long way through every field.
      local base, bonus, at
      if not drop then
        base, bonus, at = string.match(raw, '^[^|]*|[^|]*|([^|]*)|([^|]*)|[^|]*|[^|]*|()%d+|')
      end
      local meta
      if at then
        meta = queued .. base .. '|' .. bonus .. '|0|0|' .. string.sub(raw, at)
      else
        local _, _, b, bo, _, _, prio, payload = meta_fields(raw)
        base, bonus = b, bo
        meta = queued .. base .. '|' .. bonus .. '|0|0|' .. prio .. '|' .. (drop and '' or payload)
      end
      local cls = tonumber(base) - tonumber(bonus)
      local list = lists[cls]
      if not list then
        list = class_key(6, cls)
        lists[cls] = list
        scores[cls] = string.format('%.6f', cls + stamp) .. '|'
        pushes[list] = {}
        order[#order + 1] = list
      end
      local entries = pushes[list]
      entries[#entries + 1] = scores[cls] .. item
      puts[#puts + 1] = item
      puts[#puts + 1] = meta
    end
  end
  call_many('HDEL', KEYS[1], done)
  call_many('ZREM', KEYS[2], done)
  redis.call('HINCRBY', KEYS[4], 'completed', #done)
  if after == '' then
    call_many('HDEL', KEYS[3], done)
    if KEYS[5] then held_release_many(KEYS[5], done) end
  else
    call_many('HSET', KEYS[3], puts)
    for _, list in ipairs(order) do call_many('RPUSH', list, pushes[list]) end
    redis.call('HINCRBY', KEYS[5], 'enqueued', #done)
  end
end
if #ARGV <= 5 then return codes[1] end
return codes

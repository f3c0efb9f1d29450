-- FETCH: promote due delayed retries (bounded batch), pop up to `count` best items, record a
-- lease {token, worker, started} and a deadline for each.
-- KEYS: delayed, lease, deadline, meta, the stage's ready lists...
-- ARGV: worker, token, lease_ms, promote_batch, epoch_ms, count, stage[, max_bytes]
-- max_bytes (0 or absent: none) bounds the batch's payload bytes: the first item is always
-- taken, and the pop ends before an item that would pass the bound (it stays first in line),
-- so a batch of large documents holds a bounded amount of a worker's memory.
-- Returns false when the stage is empty, else a flat list of 8 fields per item: item,
-- started_ms, payload (store stage; '' at the others), base, bonus, failures, reclaims,
-- priority (submitted base).
-- A popped entry whose meta does not say "queued in this stage" is stale and skipped (lazy
-- deletion: nothing removes a given item from a ready list).
-- The batch is read and written by a few commands for all of its items (LRANGE per list,
-- one HMGET of their metas; one HSET of the metas, one of the leases, one ZADD): a
-- command per item each would cost most of the script's time.
local now = now_ms()
local epoch = tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local m = meta_get(KEYS[4], id)
  if m then
    m.status = 'q'
    meta_put(KEYS[4], id, m)
    ready_push(5, m, now, epoch, id)
  end
end
local stage, count = ARGV[7], tonumber(ARGV[6])
local started = tostring(now)
local lease = ARGV[2] .. '|' .. ARGV[1] .. '|' .. now
local deadline = now + tonumber(ARGV[3])
local max_bytes, bytes, full = tonumber(ARGV[8] or '0'), 0, false
local out, metas, leases, deadlines = {}, {}, {}, {}
local taken = {}  -- an item listed twice: its later entries are stale once it is taken
local n = 0

-- Pop up to `want` entries in score order: a merge of the class lists' first `want` entries
-- (equal scores: the earlier list in KEYS, i.e. the lower class, first; no string compare,
-- which in Lua would follow the server's locale). Stale entries are popped (dropped) and
-- count towards `want`; the pop ends before an item past max_bytes. Then one LTRIM per list
-- that gave any. Answers how many entries were popped.
local function pop(want)
  local lists = {}
  for i = 5, #KEYS do
    local entries = redis.call('LRANGE', KEYS[i], 0, want - 1)
    if #entries > 0 then
      lists[#lists + 1] = {key = KEYS[i], entries = entries, pos = 1}
    end
  end
  for _, l in ipairs(lists) do
    local s, item = string.match(l.entries[1], '^([^|]*)|(.*)$')
    l.score, l.item = tonumber(s), item
  end
  -- The merge's order, then the candidates' metas in one read.
  local order, ids = {}, {}
  while #order < want do
    local best = nil
    for _, l in ipairs(lists) do
      if l.item and (best == nil or l.score < best.score) then best = l end
    end
    if not best then break end
    order[#order + 1] = best
    ids[#ids + 1] = best.item
    best.pos = best.pos + 1
    local entry = best.entries[best.pos]
    if entry then
      local s, item = string.match(entry, '^([^|]*)|(.*)$')
      best.score, best.item = tonumber(s), item
    else
      best.item = nil
    end
  end
  if #ids == 0 then return 0 end
  for _, l in ipairs(lists) do l.pos = 1 end
  local raws = call_many('HMGET', KEYS[4], ids)
  local popped = 0
  for i, item in ipairs(ids) do
    local raw = raws[i]
    local st, s, base, bonus, f, r, prio, payload
    if raw and not taken[item] then st, s, base, bonus, f, r, prio, payload = meta_fields(raw) end
    if st == stage and s == 'q' then
      if max_bytes > 0 and n > 0 and bytes + #payload > max_bytes then
        full = true
        break
      end
      bytes = bytes + #payload
      taken[item] = true
      n = n + 1
      metas[#metas + 1] = item
      metas[#metas + 1] = st .. '|r|' .. base .. '|' .. bonus .. '|' .. f .. '|' .. r .. '|' ..
                          prio .. '|' .. payload
      leases[#leases + 1] = item
      leases[#leases + 1] = lease
      deadlines[#deadlines + 1] = deadline
      deadlines[#deadlines + 1] = item
      -- The document goes out with the store stage only: the later stages read what store
      -- wrote.
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = item, started,
        stage == 'store' and payload or '', base
      out[o + 5], out[o + 6], out[o + 7], out[o + 8] = bonus, f, r, prio
    end  -- else stale: dropped
    order[i].pos = order[i].pos + 1
    popped = popped + 1
  end
  for _, l in ipairs(lists) do
    if l.pos > 1 then redis.call('LTRIM', l.key, l.pos - 1, -1) end
  end
  return popped
end

-- Stale entries leave a batch short: pop again for the rest, a bounded number of times.
for _ = 1, 4 do
  local want = count - n
  if want <= 0 or full then break end
  if pop(want) == 0 then break end
end
if n == 0 then return false end
call_many('HSET', KEYS[4], metas)
call_many('HSET', KEYS[2], leases)
call_many('ZADD', KEYS[3], deadlines)
return out

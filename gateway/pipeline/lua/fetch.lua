-- FETCH: promote due delayed retries (bounded batch), pop up to `count` best items, record a
-- lease {token, worker, started} and a deadline for each.
-- KEYS: delayed, lease, deadline, meta, the stage's ready lists...
-- ARGV: worker, token, lease_ms, promote_batch, epoch_ms, count, stage[, max_bytes]
-- max_bytes (0 or absent: none) bounds the batch's payload bytes: the first item is always
-- taken, and the pop ends before an item that would pass the bound (it stays first in line),
-- so a batch of large documents holds a bounded amount of a worker's memory.
-- Returns false when the stage is empty, else a flat list: started_ms, then 3 fields per
-- item: item, "base|bonus|failures|reclaims|priority|" (priority: the submitted base) and the
-- payload (store stage; '' at the others).
-- A popped entry whose meta does not say "queued in this stage" is stale and skipped (lazy
-- deletion: nothing removes a given item from a ready list).
-- The batch is read and written by a few commands for all of its items (LRANGE per list,
-- one HMGET of their metas; one HSET of the metas, one of the leases, one ZADD): a
-- command per item each would cost most of the script's time. A meta is read by position
-- (one prefix compare and one pattern without captures) rather than split into its fields.
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
local queued, leased = stage .. '|q|', stage .. '|r|'
local rest_at, is_store = #queued + 1, stage == 'store'
local lease = ARGV[2] .. '|' .. ARGV[1] .. '|' .. now
local deadline = tostring(now + tonumber(ARGV[3]))
local max_bytes, bytes, full = tonumber(ARGV[8] or '0'), 0, false
local out, metas, leases, deadlines = {tostring(now)}, {}, {}, {}
local taken = {}  -- an item listed twice: its later entries are stale once it is taken
local n = 0
local find, sub = string.find, string.sub

-- Splits a ready entry "<score>|<item>".
local function entry_of(entry)
  local bar = find(entry, '|', 1, true)
  return tonumber(sub(entry, 1, bar - 1)), sub(entry, bar + 1)
end

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
  -- The merge's order (one list: its own, no score read), then the candidates' metas in
  -- one read.
  local order, ids = {}, {}
  if #lists == 1 then
    local l = lists[1]
    for i, entry in ipairs(l.entries) do
      order[i] = l
      ids[i] = sub(entry, find(entry, '|', 1, true) + 1)
    end
  elseif #lists > 1 then
    for _, l in ipairs(lists) do l.score, l.item = entry_of(l.entries[1]) end
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
        best.score, best.item = entry_of(entry)
      else
        best.item = nil
      end
    end
    for _, l in ipairs(lists) do l.pos = 1 end
  end
  if #ids == 0 then return 0 end
  local raws = call_many('HMGET', KEYS[4], ids)
  local popped = 0
  for i, item in ipairs(ids) do
    local raw = raws[i]
    if raw and not taken[item] and sub(raw, 1, rest_at - 1) == queued then
      -- "base|bonus|failures|reclaims|priority|" then the payload; an entry from before
      -- priority was kept has no priority field: its fields are rebuilt (priority = base).
      local at = string.match(raw, '^[^|]*|[^|]*|[^|]*|[^|]*|%d+|()', rest_at)
      local head, payload, meta
      if at then
        head, meta = sub(raw, rest_at, at - 1), leased .. sub(raw, rest_at)
        if is_store or max_bytes > 0 then payload = sub(raw, at) end
      else
        local _, _, base, bonus, f, r, prio, p = meta_fields(raw)
        head = base .. '|' .. bonus .. '|' .. f .. '|' .. r .. '|' .. prio .. '|'
        payload, meta = p, leased .. head .. p
      end
      if max_bytes > 0 and n > 0 and bytes + #payload > max_bytes then
        full = true
        break
      end
      if max_bytes > 0 then bytes = bytes + #payload end
      taken[item] = true
      n = n + 1
      metas[#metas + 1] = item
      metas[#metas + 1] = meta
      leases[#leases + 1] = item
      leases[#leases + 1] = lease
      deadlines[#deadlines + 1] = deadline
      deadlines[#deadlines + 1] = item
      -- The document goes out with the store stage only: the later stages read what store
      -- wrote.
      local o = #out
      out[o + 1], out[o + 2], out[o + 3] = item, head, is_store and payload or ''
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

-- Shared prelude, prepended to every pipeline script by gateway/pipeline/scripts.py.
-- Per-item metadata lives in one hash field:
-- "stage|status|base|bonus|failures|reclaims|priority|payload", payload (the document JSON,
-- or '') last and until the store stage completes: one hash entry per item instead of two.
-- status: q queued, r running (leased), w waiting for a retry, x dead. base is the scoring
-- base (10 once reclaimed); priority the base the item was submitted with, which names its
-- priority in the journal. Entries written before priority existed have one field less
-- (their payload is '' or JSON, never digits and '|'): their priority is their base.
-- redis.call(cmd, key, unpack(args)) for a list of arguments of any length: in calls of at
-- most CALL_ARGS of them (Lua's unpack stops at 8,000 values; an even count keeps field-value
-- and score-member pairs together), list replies joined. `option` (a flag such as 'XX'), if
-- given, goes before the arguments of every call.
local CALL_ARGS = 4000
local function call_many(cmd, key, args, option)
  local function call(first, last)
    if option then return redis.call(cmd, key, option, unpack(args, first, last)) end
    return redis.call(cmd, key, unpack(args, first, last))
  end
  if #args <= CALL_ARGS then return call(1, #args) end
  local out = {}
  for i = 1, #args, CALL_ARGS do
    local reply = call(i, math.min(i + CALL_ARGS - 1, #args))
    if type(reply) == 'table' then
      for j = 1, #reply do out[#out + 1] = reply[j] end
    end
  end
  return out
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A meta value's fields as strings: stage, status, base, bonus, failures, reclaims, priority,
-- payload (the scripts that handle a batch of items read them without the table of meta_get).
local function meta_fields(raw)
  local st, s, base, bonus, f, r, prio, payload = string.match(
    raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(%d+)|(.*)$')
  if not st then
    st, s, base, bonus, f, r, payload =
      string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|?(.*)$')
    prio = base
  end
  return st, s, base, bonus, f, r, prio, payload
end

local function meta_get(key, item)
  local raw = redis.call('HGET', key, item)
  if not raw then return nil end
  local st, s, base, bonus, f, r, prio, payload = meta_fields(raw)
  return {stage = st, status = s, base = tonumber(base), bonus = tonumber(bonus),
          failures = tonumber(f), reclaims = tonumber(r), priority = tonumber(prio),
          payload = payload}
end

local function meta_put(key, item, m)
  redis.call('HSET', key, item, m.stage .. '|' .. m.status .. '|' .. m.base .. '|' ..
             m.bonus .. '|' .. m.failures .. '|' .. m.reclaims .. '|' .. m.priority .. '|' ..
             m.payload)
end

-- base - bonus + 0.001 * (t - EPOCH) with t in seconds; epoch and now in milliseconds.
local function score(m, now, epoch)
  return string.format('%.6f', m.base - m.bonus + (now - epoch) / 1000000)
end

-- Ready sets: one LIST per `base - bonus` class of a stage, entries "<score>|<item>", oldest
-- first. Every insertion is scored with the current TIME, so each list is sorted by score.
-- The class lists are the LAST keys of a script, KEYS[first..#KEYS]; a class's list is the
-- one whose name ends in ":<base - bonus>".
local function class_key(first, cls)
  local want = ':' .. cls
  for i = first, #KEYS do
    if string.sub(KEYS[i], -#want) == want then return KEYS[i] end
  end
  error('no ready list for class ' .. want)
end

local function class_list(first, m)
  return class_key(first, m.base - m.bonus)
end

local function ready_push(first, m, now, epoch, item)
  redis.call('RPUSH', class_list(first, m), score(m, now, epoch) .. '|' .. item)
end

-- Lease value: "token|worker|started_ms". Answers 1 when `token` holds it, -1 when nobody
-- holds it, -2 when someone else does.
local function check_lease(lease_key, item, token)
  local raw = redis.call('HGET', lease_key, item)
  if not raw then return -1, nil end
  local held = string.match(raw, '^([^|]*)|')
  if held ~= token then return -2, raw end
  return 1, raw
end

-- The token holder's item leaves its lease: answers 1 with the lease and deadline entries
-- removed, or -1 / -2 as check_lease with nothing written.
local function end_lease(lease_key, deadline_key, item, token)
  local code = check_lease(lease_key, item, token)
  if code == 1 then
    redis.call('HDEL', lease_key, item)
    redis.call('ZREM', deadline_key, item)
  end
  return code
end

local function dead_letter(dead_key, meta_key, stats_key, item, m, reason, now)
  m.status = 'x'
  meta_put(meta_key, item, m)
  redis.call('RPUSH', dead_key, cjson.encode({item_id = item, stage = m.stage, reason = reason,
    at = tostring(now), failures = m.failures, reclaims = m.reclaims}))
  redis.call('HINCRBY', stats_key, 'dead', 1)
end

-- An owner's quota: the hash holds each of its items still in the pipeline (item -> payload
-- bytes) and their sum under '~bytes'. Items leave the pipeline by several scripts, none of
-- which knows owners: an entry whose item has left is dropped here, lazily, only when the
-- owner looks full (a random sample of 16 per call, so the cost stays bounded and an owner
-- whose items have finished is let in again after a call or two). The sample is small
-- because an owner at its quota may keep calling: a refusal costs about 1.5 accepts of
-- Redis time (bench/quota.py: 33 µs against 22; a sample of 128 cost 133).
-- Takes the new item's place and answers true, or answers false (nothing written) when it
-- does not fit.
local QUOTA_BYTES, QUOTA_SWEEP = '~bytes', 16
local function quota_take(quota, meta, item, size, max_items, max_bytes)
  local total = tonumber(redis.call('HGET', quota, QUOTA_BYTES) or '0')
  local count = redis.call('HLEN', quota) - (total > 0 and 1 or 0)
  local function fits()
    return (max_items <= 0 or count + 1 <= max_items)
       and (max_bytes <= 0 or total + size <= max_bytes)
  end
  if not fits() then
    local sample = redis.call('HRANDFIELD', quota, QUOTA_SWEEP, 'WITHVALUES')
    for i = 1, #sample, 2 do
      local held = sample[i]
      if held ~= QUOTA_BYTES and redis.call('HEXISTS', meta, held) == 0 then
        redis.call('HDEL', quota, held)
        total = total - tonumber(sample[i + 1])
        count = count - 1
      end
    end
    if total <= 0 then redis.call('HDEL', quota, QUOTA_BYTES); total = 0 end
    if total > 0 then redis.call('HSET', quota, QUOTA_BYTES, total) end
    if not fits() then return false end
  end
  -- One call for the entry and the sum: the script is atomic, so the sum read above and
  -- written here is an increment.
  redis.call('HSET', quota, item, size, QUOTA_BYTES, total + size)
  return true
end

-- Admission by class: the held hash (one key, q:{pipeline}:held) maps each item accepted with
-- a class to "<class>|<cost>", with each class's sum under "bytes <class>" and all classes'
-- under "bytes *" (field names with a space: no item id has one). The cost estimates what the
-- item takes of the instance's memory: its payload rounded up to the allocator's size class
-- (jemalloc: four classes per doubling) plus ITEM_OVERHEAD for its meta field, ready entry,
-- seen entry, claim, quota and held entries. It is taken by ADD in the call that enqueues and
-- given back by the scripts that remove the item's meta (the last COMPLETE, PURGE), so the
-- sums are exact under any concurrency.
local ITEM_OVERHEAD, HELD_ALL = 512, 'bytes *'
local function item_cost(size)
  local step = 16
  while step * 8 < size do step = step * 2 end
  return math.ceil(size / step) * step + ITEM_OVERHEAD
end

-- The item leaves the pipeline: its class gets its cost back (nothing when it had none).
local function held_release(held, item)
  local entry = redis.call('HGET', held, item)
  if not entry then return end
  local class, cost = string.match(entry, '^(.*)|(%d+)$')
  redis.call('HDEL', held, item)
  redis.call('HINCRBY', held, 'bytes ' .. class, -tonumber(cost))
  redis.call('HINCRBY', held, HELD_ALL, -tonumber(cost))
end

-- What ADD needs of the held hash, in one call: {everything held, `class`'s sum, `item`'s
-- own entry}, each false when absent.
local function held_read(held, class, item)
  return redis.call('HMGET', held, HELD_ALL, 'bytes ' .. class, item)
end

-- Takes `cost` for `item` under `class`, given held_read's answer `h`: the entry and both
-- sums in one HSET (the script is atomic, so a sum read and written is an increment).
local function held_take(held, class, item, cost, h)
  if h[3] then  -- an entry left by an earlier run of the id is not counted twice
    held_release(held, item)
    h = held_read(held, class, item)
  end
  redis.call('HSET', held, item, class .. '|' .. cost, 'bytes ' .. class,
             tonumber(h[2] or '0') + cost, HELD_ALL, tonumber(h[1] or '0') + cost)
end

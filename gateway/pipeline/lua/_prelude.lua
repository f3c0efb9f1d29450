-- Shared prelude, prepended to every pipeline script by gateway/pipeline/scripts.py.
-- Per-item metadata lives in one hash field:
-- "stage|status|base|bonus|failures|reclaims|payload", payload (the document JSON, or '')
-- last and until the store stage completes: one hash entry per item instead of two.
-- status: q queued, r running (leased), w waiting for a retry, x dead.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function meta_get(key, item)
  local raw = redis.call('HGET', key, item)
  if not raw then return nil end
  local st, s, base, bonus, f, r, payload =
    string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|?(.*)$')
  return {stage = st, status = s, base = tonumber(base), bonus = tonumber(bonus),
          failures = tonumber(f), reclaims = tonumber(r), payload = payload}
end

local function meta_put(key, item, m)
  redis.call('HSET', key, item, m.stage .. '|' .. m.status .. '|' .. m.base .. '|' ..
             m.bonus .. '|' .. m.failures .. '|' .. m.reclaims .. '|' .. m.payload)
end

-- base - bonus + 0.001 * (t - EPOCH) with t in seconds; epoch and now in milliseconds.
local function score(m, now, epoch)
  return string.format('%.6f', m.base - m.bonus + (now - epoch) / 1000000)
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

local function dead_letter(dead_key, meta_key, stats_key, item, m, reason, now)
  m.status = 'x'
  meta_put(meta_key, item, m)
  redis.call('RPUSH', dead_key, cjson.encode({item_id = item, stage = m.stage, reason = reason,
    at = tostring(now), failures = m.failures, reclaims = m.reclaims}))
  redis.call('HINCRBY', stats_key, 'dead', 1)
end

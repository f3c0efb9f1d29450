-- Several sliding-window logs admitted together or not at all (a provider call takes a
-- request and its tokens at the same instant: taken one after the other, a request admitted
-- in one window could go out in the next, beside that window's own).
--
-- A group may have a cool-down, a deadline set by cooldown.lua (a provider's 429 with
-- Retry-After): until then nothing is admitted, so every caller of every replica waits it
-- out, read in this same call (no round trip of its own). It may also have concurrency
-- slots: the attempt is admitted only holding one, taken in the same call and kept while
-- the windows refuse (a provider call's three limits in one script; the slot is given back
-- by amend.lua, or by the caller when it stops waiting).
--
-- KEYS[2i-1], KEYS[2i]  the log and its total of window i (all under one hash tag)
-- KEYS[2n+1]            optional: the group's cool-down key (same hash tag)
-- KEYS[#KEYS]           with a slot limit: the group's slots (same hash tag)
-- ARGV[1]               number of windows n
-- ARGV[2 + 3(i-1) ..]   per window: limit, window length µs, cost (0 = not counted)
-- ARGV[2 + 3n]          unique id of this attempt (the slot's holder too)
-- ARGV[3 + 3n]          "now" in µs for simulated clocks; empty = Redis TIME
-- ARGV[4 + 3n], [5 + 3n]  optional: slot limit and lease µs (empty: no slot)
-- Returns {admitted 1|0|-1 (a cost above its limit), wait µs, now µs, cooling 1|0, slot 1|0}
-- as strings (cooling 1: the wait is the cool-down's; slot 1: the slots are all held).
local n = tonumber(ARGV[1])
local id = ARGV[2 + 3 * n]
local now = clock(ARGV[3 + 3 * n])
local slot_limit = tonumber(ARGV[4 + 3 * n] or '')
local slot_key = slot_limit and KEYS[#KEYS]
local cooldown_key = #KEYS > 2 * n + (slot_limit and 1 or 0) and KEYS[2 * n + 1]
local windows = {}
for i = 1, n do
  local base = 2 + 3 * (i - 1)
  local w = {key = KEYS[2 * i - 1], total = KEYS[2 * i], limit = tonumber(ARGV[base]),
             span = tonumber(ARGV[base + 1]), cost = tonumber(ARGV[base + 2])}
  if w.cost > w.limit then return {-1, '0', fmt(now), '0', '0'} end
  w.member = id .. ':' .. fmt(w.cost)
  windows[i] = w
end
-- A client retry of an attempt that already ran finds its entry: answer as before. Its
-- entries went in together, at one instant: the one in the longest window is there as long
-- as any is, so it alone is asked.
local longest
for _, w in ipairs(windows) do
  if w.cost > 0 and (longest == nil or w.span > longest.span) then longest = w end
end
if longest and redis.call('ZSCORE', longest.key, longest.member) then
  return {1, '0', fmt(now), '0', '0'}
end
if cooldown_key then
  local deadline = tonumber(redis.call('GET', cooldown_key))
  if deadline and deadline > now then return {0, fmt(deadline - now), fmt(now), '1', '0'} end
end
if slot_key then
  -- The slot is taken (or renewed) before the windows are asked, and kept while they refuse:
  -- the attempt waits for its windows holding it, as one taken first would.
  local wait = slot_wait(slot_key, id, slot_limit, now)
  if wait > 0 then return {0, fmt(wait), fmt(now), '0', '1'} end
  slot_take(slot_key, id, tonumber(ARGV[5 + 3 * n]), now)
end
local fits = true
for _, w in ipairs(windows) do
  if w.cost > 0 then
    w.used = used_in(w.key, w.total, w.span, now)
    if w.used + w.cost > w.limit then fits = false end
  end
end
if fits then
  for _, w in ipairs(windows) do
    if w.cost > 0 then admit(w.key, w.total, w.member, w.used, w.cost, w.span, now) end
  end
  return {1, '0', fmt(now), '0', '0'}
end
local wait = 1
for _, w in ipairs(windows) do
  if w.cost > 0 then
    keep_total(w.total, w.used)
    local this = wait_for(w.key, w.used + w.cost - w.limit, w.span, now - w.span, now)
    if this > wait then wait = this end
  end
end
return {0, fmt(wait), fmt(now), '0', '0'}

-- Sliding-window log limiter on Redis time (DESIGN §5), exact at window edges.
--
-- KEYS[1]  rl:window:<name>, a ZSET: member "<id>:<cost>", score = admission time in µs.
-- ARGV[1]  limit: units admitted per window (rate)
-- ARGV[2]  window length in µs (period)
-- ARGV[3]  smoothing limit: units admitted per smoothing window (burst)
-- ARGV[4]  smoothing window length in µs (burst * period / rate)
-- ARGV[5]  cost of this attempt in units
-- ARGV[6]  unique id of this attempt
-- ARGV[7]  "now" in µs for simulated clocks; empty = Redis TIME (the production path)
--
-- An entry admitted at t counts while now < t + window, so every half-open interval of one
-- window's length holds at most `limit` units; the smoothing window does the same for burst.
-- Returns {admitted 1|0|-1 (cost above a limit), wait µs, now µs} with numbers as strings.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local smooth = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local now
if ARGV[7] ~= '' then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%.0f', n) end
if cost > limit or cost > burst then
  return {-1, '0', fmt(now)}
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local used, used_smooth = 0, 0
local costs, scores = {}, {}
for i = 1, #entries, 2 do
  local c = tonumber(string.match(entries[i], ':(%d+)$')) or 1
  local s = tonumber(entries[i + 1])
  costs[#costs + 1] = c
  scores[#scores + 1] = s
  used = used + c
  if s > now - smooth then used_smooth = used_smooth + c end
end

if used + cost <= limit and used_smooth + cost <= burst then
  redis.call('ZADD', key, fmt(now), ARGV[6] .. ':' .. fmt(cost))
  redis.call('PEXPIRE', key, math.ceil(window / 1000) + 1)
  return {1, '0', fmt(now)}
end

-- How long until enough of the oldest entries leave each window for this cost to fit.
local function wait_for(excess, span, from)
  if excess <= 0 then return 0 end
  local freed = 0
  for i = 1, #scores do
    if scores[i] > from then
      freed = freed + costs[i]
      if freed >= excess then return scores[i] + span - now end
    end
  end
  return span
end
local wait = wait_for(used + cost - limit, window, now - window)
local wait_smooth = wait_for(used_smooth + cost - burst, smooth, now - smooth)
if wait_smooth > wait then wait = wait_smooth end
if wait < 1 then wait = 1 end
return {0, fmt(wait), fmt(now)}

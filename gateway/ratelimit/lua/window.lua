-- Sliding-window log limiter on Redis time, exact at window edges.
--
-- KEYS[1]  rl:window:{<name>}        ZSET: member "<id>:<cost>", score = admission time (µs)
-- KEYS[2]  rl:window:{<name>}:total  the sum of the costs in KEYS[1] (one hash tag: Cluster)
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
-- Work per call is O(log n) plus the entries that expire now (each is removed once) and the
-- entries inside the smoothing window (at most `burst`); only a refusal walks the log to say
-- how long to wait.
-- Returns {admitted 1|0|-1 (cost above a limit), wait µs, now µs} with numbers as strings.
local key, total_key = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local smooth = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local now = clock(ARGV[7])
if cost > limit or cost > burst then
  return {-1, '0', fmt(now)}
end
-- A client retry of an attempt that already ran (its reply was lost) finds its own entry:
-- answer as before instead of counting the cost twice.
local member = ARGV[6] .. ':' .. fmt(cost)
if redis.call('ZSCORE', key, member) then
  return {1, '0', fmt(now)}
end

local used = used_in(key, total_key, window, now)
local used_smooth = used
if burst < limit then
  used_smooth = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - smooth), '+inf')) do
    used_smooth = used_smooth + cost_of(member)
  end
end

if used + cost <= limit and used_smooth + cost <= burst then
  admit(key, total_key, member, used, cost, window, now)
  return {1, '0', fmt(now)}
end
keep_total(total_key, used)

-- How long until enough of the oldest entries leave each window for this cost to fit.
local wait = wait_for(key, used + cost - limit, window, now - window, now)
local wait_smooth = wait_for(key, used_smooth + cost - burst, smooth, now - smooth, now)
if wait_smooth > wait then wait = wait_smooth end
if wait < 1 then wait = 1 end
return {0, fmt(wait), fmt(now)}

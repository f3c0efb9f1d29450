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
local function cost_of(member) return tonumber(string.match(member, ':(%d+)$')) or 1 end
if cost > limit or cost > burst then
  return {-1, '0', fmt(now)}
end
-- A client retry of an attempt that already ran (its reply was lost) finds its own entry:
-- answer as before instead of counting the cost twice.
local member = ARGV[6] .. ':' .. fmt(cost)
if redis.call('ZSCORE', key, member) then
  return {1, '0', fmt(now)}
end

-- Expire old entries, keeping the running total in step (recomputed if it went missing).
local used = tonumber(redis.call('GET', total_key))
if used == nil then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
  used = 0
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do used = used + cost_of(member) end
else
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now - window))
  for _, member in ipairs(expired) do used = used - cost_of(member) end
  if #expired > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window)) end
end

local used_smooth = used
if burst < limit then
  used_smooth = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - smooth), '+inf')) do
    used_smooth = used_smooth + cost_of(member)
  end
end

local ttl = math.ceil(window / 1000) + 1
if used + cost <= limit and used_smooth + cost <= burst then
  redis.call('ZADD', key, fmt(now), member)
  redis.call('SET', total_key, fmt(used + cost), 'PX', ttl)
  redis.call('PEXPIRE', key, ttl)
  return {1, '0', fmt(now)}
end
if used > 0 then
  redis.call('SET', total_key, fmt(used), 'KEEPTTL')
else
  redis.call('DEL', total_key)
end

-- How long until enough of the oldest entries leave each window for this cost to fit.
local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local function wait_for(excess, span, from)
  if excess <= 0 then return 0 end
  local freed = 0
  for i = 1, #entries, 2 do
    local score = tonumber(entries[i + 1])
    if score > from then
      freed = freed + cost_of(entries[i])
      if freed >= excess then return score + span - now end
    end
  end
  return span
end
local wait = wait_for(used + cost - limit, window, now - window)
local wait_smooth = wait_for(used_smooth + cost - burst, smooth, now - smooth)
if wait_smooth > wait then wait = wait_smooth end
if wait < 1 then wait = 1 end
return {0, fmt(wait), fmt(now)}

-- Shared functions of the sliding-window log scripts (prepended after clock.lua).
-- A log is a ZSET of members "<id>:<cost>" scored by admission time (µs), beside a running
-- total of the costs under <key>:total (same hash tag, so Cluster keeps them together).
local function cost_of(member) return tonumber(string.match(member, ':(%d+)$')) or 1 end

-- Drop entries older than one window and return the cost still inside it, keeping the
-- running total in step (recomputed from the log if it went missing).
local function used_in(key, total_key, window, now)
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
  return used
end

-- Record an admitted entry and the new total; both expire a little after the window.
local function admit(key, total_key, member, used, cost, window, now)
  local ttl = math.ceil(window / 1000) + 1
  redis.call('ZADD', key, fmt(now), member)
  redis.call('SET', total_key, fmt(used + cost), 'PX', ttl)
  redis.call('PEXPIRE', key, ttl)
end

-- A refused attempt admits nothing: keep the total as recomputed (or drop it when zero).
local function keep_total(total_key, used)
  if used > 0 then
    redis.call('SET', total_key, fmt(used), 'KEEPTTL')
  else
    redis.call('DEL', total_key)
  end
end

-- How long until enough of the oldest entries after `from` leave a span of `span` µs for
-- `excess` units to fit (0 when nothing is in excess).
local function wait_for(key, excess, span, from, now)
  if excess <= 0 then return 0 end
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
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

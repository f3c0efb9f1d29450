-- Shared prelude of the rl: scripts (prepended by limiter.py): the clock and number output.
-- Time is Redis TIME in µs; a non-empty argument replaces it (a simulated clock for tests).
local function clock(override)
  if override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Lua numbers reach the client truncated to integers: return them as strings. Every number
-- here is a whole one (µs, costs); '%d' formats it as an integer, a third cheaper than
-- '%.0f' (a double's exact decimal expansion) for a µs timestamp.
local function fmt(n) return string.format('%d', n) end

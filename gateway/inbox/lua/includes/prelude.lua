-- Shared prelude, prepended to every inbox script by gateway/inbox/scripts.py.
-- Per platform: a ready sorted set (chat -> when it became ready, ms), a lease sorted set
-- (chat -> lease deadline, ms), an owners hash (chat -> the holder's token), a failures hash
-- (chat -> failed attempts of its head entry), a sent hash (chat -> digest of the head
-- entry whose reply has left), a takes hash (chat -> times its head was taken, by TAKE or
-- as the next entry of an ACK, and not yet finished), a dead-letter list, and one list per chat (its entries in
-- arrival order; the head is the one being processed).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The chat's head entry failed once more: past `max_failures` (at once when `max_failures`
-- is 1) it moves to the dead-letter list, kept to `dead_max` entries, and its failures, its
-- takes and the record of its reply (`sent`: no ACK will clear it) are forgotten. True when
-- it moved. `marks` is {sent, takes}.
local function count_failure(failures, dead, marks, list, chat, max_failures, dead_max)
  local n = redis.call('HINCRBY', failures, chat, 1)
  if n < max_failures then return false end
  local head = redis.call('LPOP', list)
  if head then
    redis.call('LPUSH', dead, head)
    redis.call('LTRIM', dead, 0, dead_max - 1)
  end
  redis.call('HDEL', failures, chat)
  redis.call('HDEL', marks[1], chat)
  redis.call('HDEL', marks[2], chat)
  return true
end

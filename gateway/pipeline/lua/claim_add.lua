-- CLAIM_ADD: the inbound path's dedup claim and ADD as one atomic call. Only on a single
-- instance (or a Sentinel primary): on a cluster the claim key is outside the pipeline's slot.
-- Assembled by gateway/pipeline/scripts.py as: prelude, add.lua wrapped in add_item(), this.
-- KEYS: ADD's six keys, then the claim key (dedup:webhook:... / dedup:job:...), then
--       optionally a guard key (see guard_add.lua): when it exists nothing is written.
-- ARGV: ADD's thirteen arguments, then the claim's TTL in seconds.
-- A new claim is the script's first write, so on a full instance (maxmemory) Redis refuses it
-- with OOM before anything is written; once it is written the rest runs to the end. So there
-- is never a claim whose item failed to enqueue, nothing to release, and the claim is 'done'
-- from the start. Behind an existing claim ADD still decides (its window, the claim TTL): for a
-- duplicate it only reads, so duplicates are answered even while the instance is full, and a
-- claim left 'in-progress' by the two-command path cannot swallow a retry.
-- Returns ADD's answer: 1 enqueued, 0 duplicate, -3 over quota, -4 over the class's limit
-- (the claim is then left as it was: ADD decides the retry too); -1 refused by the guard.
if KEYS[8] and redis.call('EXISTS', KEYS[8]) == 1 then return -1 end
local had_claim = redis.call('EXISTS', KEYS[7]) == 1
if not had_claim then
  redis.call('SET', KEYS[7], 'done', 'EX', ARGV[14])
end
local added = add_item()
if added < 0 and not had_claim then redis.call('DEL', KEYS[7]) end
return added
